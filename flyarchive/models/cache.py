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
#: Bytes objects whose SHA-256 is kept, at most.
DIGESTS_KEPT = 4

#: The SHA-256 of the last bytes objects hashed, by ``id`` (the object kept alive with it,
#: so that its ``id`` is not reused while it is kept).
_DIGESTS: LRUCache[int, tuple[bytes, str]] = LRUCache(DIGESTS_KEPT, name="SHA-256 of bytes")


def model_from_bytes(blob: bytes) -> mujoco.MjModel:
    """The model of MJB bytes you trust (:func:`~flyarchive.models.mjb.model_bytes`),
    loaded once per process (see the module's docstring).

    Raises:
        ModelLoadError: the bytes are not an MJB this MuJoCo can load.
    """
    return loaded_model(bytes_sha256(blob), lambda: blob)


def keep_loaded(blob: bytes, model: mujoco.MjModel) -> None:
    """Let :func:`model_from_bytes` of ``blob`` answer ``model``: the model this process
    loaded from exactly those bytes already (a kept model, checked and loaded once for a
    render's planning), so that its renderers do not load them again. ``model`` must not
    be modified afterwards."""
    _MODELS.get(bytes_sha256(blob), lambda: model)


def bytes_sha256(blob: bytes) -> str:
    """The SHA-256 (hex) of ``blob``, computed once per bytes object that this process
    holds (a render asks for its model's 23 MB once per renderer and segment): kept for
    the last few objects, by identity (the object is kept alive with its digest, so its
    ``id`` is not reused)."""
    kept, digest = _DIGESTS.get(id(blob), lambda: (blob, hashlib.sha256(blob).hexdigest()))
    return digest if kept is blob else hashlib.sha256(blob).hexdigest()


def loaded_model(sha256: str, read: Callable[[], bytes]) -> mujoco.MjModel:
    """The model of the MJB bytes whose SHA-256 is ``sha256`` (hex, computed by the
    caller), loaded once per process: ``read()`` gives the bytes, and is called only when
    the model is not loaded yet (a Dask task's bytes may have to be fetched).

    Raises:
        ModelLoadError: the bytes are not an MJB this MuJoCo can load.
    """
    return _MODELS.get(sha256, lambda: load_mjb(read(), f"the model (sha256 {sha256[:12]}...)"))
