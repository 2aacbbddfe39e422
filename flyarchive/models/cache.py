"""The models this process loaded from MJB bytes, by the bytes' SHA-256: each loaded once
and shared by every reader in the process (renderers, kinematics engines, their threads).

A model is only read once loaded (kinematics and rendering write an ``MjData``, never the
``MjModel``), so one object serves every thread; do not modify a model taken from here.
The last :data:`MODELS_KEPT` models are kept (:class:`~flyarchive.lru.LRUCache`), the
least recently used going first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import mujoco

from flyarchive.lru import LRUCache
from flyarchive.models.mjb import load_mjb

#: Models kept loaded, at most.
MODELS_KEPT = 8

_MODELS: LRUCache[str, mujoco.MjModel] = LRUCache(MODELS_KEPT, name="models by MJB sha256")


def model_from_bytes(blob: bytes) -> mujoco.MjModel:
    """The model of MJB bytes you trust (:func:`~flyarchive.models.mjb.model_bytes`),
    loaded once per process (see the module's docstring).

    Raises:
        ModelLoadError: the bytes are not an MJB this MuJoCo can load.
    """
    return loaded_model(hashlib.sha256(blob).hexdigest(), lambda: blob)


def loaded_model(sha256: str, read: Callable[[], bytes]) -> mujoco.MjModel:
    """The model of the MJB bytes whose SHA-256 is ``sha256`` (hex, computed by the
    caller), loaded once per process: ``read()`` gives the bytes, and is called only when
    the model is not loaded yet (a Dask task's bytes may have to be fetched).

    Raises:
        ModelLoadError: the bytes are not an MJB this MuJoCo can load.
    """
    return _MODELS.get(sha256, lambda: load_mjb(read(), f"the model (sha256 {sha256[:12]}...)"))
