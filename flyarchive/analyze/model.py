"""The model positions are computed with: the one kept beside the archive (loaded as
every reader loads it, :func:`flyarchive.store.kept_models.kept_model`: checked in a short-lived
child process first), or one given and checked against the archive's layout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mujoco

from flyarchive.errors import ModelLoadError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.models import model_bytes


@dataclass(frozen=True)
class AnalysisModel:
    """A model checked against an archive, with its MJB bytes (what workers get).

    Attributes:
        model: The compiled model, on the host.
        blob: Its MJB bytes.
        sha256: SHA-256 of ``blob`` (hex): what Dask workers and caches know it by.
        identity: The model's identity in provenance (kept positions name the model they
            were computed with by it): the archive's
            (:func:`flyarchive.store.derived.model_identity`) when it is the model the
            archive keeps, else ``sha256``.
    """

    model: mujoco.MjModel = field(repr=False)
    blob: bytes = field(repr=False)
    sha256: str
    identity: str


def analysis_model(layout_attrs: Any, *, url: str | None, model: mujoco.MjModel | None,
                   storage_options: Mapping[str, Any] | None = None,
                   archive_attrs: Mapping[str, Any] | None = None) -> AnalysisModel:
    """The model to compute an archive's positions with.

    Args:
        layout_attrs: The archive's ``layout`` attribute.
        archive_attrs: The archive's attributes, where the kept model's identity is read
            (None: its identity is the SHA-256 of its MJB bytes).
        url: The archive's URL (where its model is kept); None when unknown.
        model: A compiled model; None: the one kept beside the archive.

    Raises:
        ModelLoadError: no model given and the archive keeps none (or its URL is unknown).
        UnsafeModelError: the kept model crashed (or did not finish) the child process that
            loads it first.
        LayoutMismatchError: the model does not fit the archive (names the first difference).
    """
    kept = model is None
    if model is None:
        if url is None:
            raise ModelLoadError(
                "The dataset does not say which archive it was opened from, and no model was "
                "given. Pass the compiled model the archive was recorded with: model=... (an "
                "MjModel), or --model FILE (.mjb or .xml).")
        from flyarchive.store.kept_models import kept_model

        model, blob = kept_model(url, storage_options)  # checked in a child process first
    else:
        if not isinstance(model, mujoco.MjModel):
            raise ModelLoadError(
                f"model must be a compiled mujoco.MjModel, got {type(model).__name__}. Load "
                "it with flyarchive.models.load_model(path).")
        blob = model_bytes(model)
    check_compatible(ModelLayout.from_attrs(layout_attrs), ModelLayout.from_model(model))
    sha256 = hashlib.sha256(blob).hexdigest()
    identity = None
    if kept and archive_attrs is not None:
        from flyarchive.store.derived import model_identity

        identity = model_identity(archive_attrs)
    return AnalysisModel(model, blob, sha256, identity or sha256)
