"""The model positions are computed with: the one kept beside the archive, or one given
and checked against the archive's layout.

Loading a kept model is done here only (:func:`kept_model`), so that it can follow the
store's way of loading models (a kept model checked in a child process first) in one
place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mujoco

from flyarchive.errors import ModelLoadError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.models import load_mjb, model_bytes


@dataclass(frozen=True)
class AnalysisModel:
    """A model checked against an archive, with its MJB bytes (what workers get).

    Attributes:
        model: The compiled model, on the host.
        blob: Its MJB bytes.
        sha256: SHA-256 of ``blob`` (hex): the model's identity in provenance.
    """

    model: mujoco.MjModel = field(repr=False)
    blob: bytes = field(repr=False)
    sha256: str


def kept_model(url: str, storage_options: Mapping[str, Any] | None = None
               ) -> tuple[mujoco.MjModel, bytes] | None:
    """The model kept beside the archive at ``url`` and its bytes; None when it keeps none.

    Raises:
        ModelLoadError: the kept bytes are not an MJB this MuJoCo loads.
        CorruptArchiveError: the kept model is missing or does not hash to its name.
    """
    from flyarchive.store import open_group
    from flyarchive.store.kept_models import read_model

    stored = read_model(open_group(url, storage_options), url)
    if stored is None:
        return None
    blob, entry = stored
    return load_mjb(blob, f"the model kept in the archive ({url.rstrip('/')}/{entry['path']})"), blob


def analysis_model(layout_attrs: Any, *, url: str | None, model: mujoco.MjModel | None,
                   storage_options: Mapping[str, Any] | None = None) -> AnalysisModel:
    """The model to compute an archive's positions with.

    Args:
        layout_attrs: The archive's ``layout`` attribute.
        url: The archive's URL (where its model is kept); None when unknown.
        model: A compiled model; None: the one kept beside the archive.

    Raises:
        ModelLoadError: no model given and the archive keeps none (or its URL is unknown).
        LayoutMismatchError: the model does not fit the archive (names the first difference).
    """
    if model is None:
        kept = kept_model(url, storage_options) if url is not None else None
        if kept is None:
            where = f"The archive at {url!r} keeps no model" if url is not None else \
                "The dataset does not say which archive it was opened from"
            raise ModelLoadError(
                f"{where}, and no model was given. Pass the compiled model the archive was "
                "recorded with: model=... (an MjModel), or --model FILE (.mjb or .xml).")
        model, blob = kept
    else:
        if not isinstance(model, mujoco.MjModel):
            raise ModelLoadError(
                f"model must be a compiled mujoco.MjModel, got {type(model).__name__}. Load "
                "it with flyarchive.models.load_model(path).")
        blob = model_bytes(model)
    check_compatible(ModelLayout.from_attrs(layout_attrs), ModelLayout.from_model(model))
    return AnalysisModel(model, blob, hashlib.sha256(blob).hexdigest())
