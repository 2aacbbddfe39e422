"""The model positions are computed with: the one kept beside the archive (loaded as
every reader loads it, :func:`flyarchive.models.kept.kept_model`: checked in a short-lived
child process first), or one given and checked against the archive's layout.

A kept model is loaded once per process: the next call on an archive that names the same
model (by its identity, :func:`flyarchive.models.model_identity`: the portable form's
SHA-256 when kept, else the MJB's; the bytes were checked against it when they were read)
takes the one loaded (NeuroMechFly: 23 MB read, hashed and loaded, 0.1-0.9 s on a
2-core VM, per call before).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mujoco

from flyarchive.errors import ModelLoadError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.lru import LRUCache
from flyarchive.models import model_bytes, model_identity

#: Kept models loaded in this process, by their identity (:func:`model_identity`): the last two.
_KEPT: LRUCache[str, AnalysisModel] = LRUCache(2, name="kept models by identity")


@dataclass(frozen=True)
class AnalysisModel:
    """A model checked against an archive, with its MJB bytes (what workers get).

    Attributes:
        model: The compiled model, on the host.
        blob: Its MJB bytes.
        sha256: SHA-256 of ``blob`` (hex): what Dask workers and caches know it by.
        identity: The model's identity in provenance (kept positions name the model they
            were computed with by it): the archive's
            (:func:`flyarchive.models.model_identity`) when it is the model the archive
            keeps, else (the default) ``sha256``.
    """

    model: mujoco.MjModel = field(repr=False)
    blob: bytes = field(repr=False)
    sha256: str
    identity: str = ""

    def __post_init__(self) -> None:
        if not self.identity:
            object.__setattr__(self, "identity", self.sha256)


def analysis_model(layout_attrs: Any, *, url: str | None, model: mujoco.MjModel | None,
                   storage_options: Mapping[str, Any] | None = None,
                   archive_attrs: Mapping[str, Any] | None = None) -> AnalysisModel:
    """The model to compute an archive's positions with.

    Args:
        layout_attrs: The archive's ``layout`` attribute.
        url: The archive's URL (where its model is kept); None when unknown.
        model: A compiled model; None: the one kept beside the archive.
        archive_attrs: The archive's attributes, where the kept model's identity is read
            (:func:`model_identity`): a kept model of that identity loaded earlier in this
            process is taken (see the module's docstring); None: loaded from the archive.

    Raises:
        ModelLoadError: no model given and the archive keeps none (or its URL is unknown).
        UnsafeModelError: the kept model crashed (or did not finish) the child process that
            loads it first.
        LayoutMismatchError: the model does not fit the archive (names the first difference).
    """
    if model is None:
        if url is None:
            raise ModelLoadError(
                "The dataset does not say which archive it was opened from, and no model was "
                "given. Pass the compiled model the archive was recorded with: model=... (an "
                "MjModel), or --model FILE (.mjb or .xml).")
        named = model_identity(archive_attrs) if archive_attrs is not None else None
        if named is None:
            checked = _kept(url, storage_options)
        else:
            checked = _KEPT.get(named, lambda: _kept(url, storage_options))
            if checked.identity != named:  # the archive was replaced since it was opened
                _KEPT.pop(named)
    else:
        if not isinstance(model, mujoco.MjModel):
            raise ModelLoadError(
                f"model must be a compiled mujoco.MjModel, got {type(model).__name__}. Load "
                "it with flyarchive.load_model_file(path).")
        blob = model_bytes(model)
        checked = AnalysisModel(model, blob, hashlib.sha256(blob).hexdigest())
    check_compatible(ModelLayout.from_attrs(layout_attrs), ModelLayout.from_model(checked.model))
    return checked


def _kept(url: str, storage_options: Mapping[str, Any] | None) -> AnalysisModel:
    """The model kept beside the archive at ``url``, read and checked now, named by the
    identity its archive gives it now."""
    from flyarchive.models.kept import kept_model
    from flyarchive.store.opener import open_for_reading

    group = open_for_reading(url, storage_options, attributes_only=True)
    model, blob = kept_model(url, storage_options, group=group)  # checked in a child first
    digest = hashlib.sha256(blob).hexdigest()
    return AnalysisModel(model, blob, digest, model_identity(group.attrs.asdict()) or digest)
