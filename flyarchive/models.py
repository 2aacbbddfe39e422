"""The compiled MuJoCo model that replay and import need: load, save, and as bytes.

The archive's attributes never hold the model; a model travels to workers, and is
kept beside an archive, as its exact compiled form (MJB bytes).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path

import mujoco
import numpy as np

from flyarchive.errors import CameraNotFoundError, ModelLoadError

__all__ = ["load_model", "save_mjb", "model_bytes", "model_from_bytes", "camera_names",
           "camera_ids"]


def load_model(path: str | Path) -> mujoco.MjModel:
    """Load an MJCF ``.xml`` (with its assets beside it) or a compiled ``.mjb``.

    Raises:
        ModelLoadError: no such file, an unknown suffix, or MuJoCo refuses the model.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"No model file at {str(path)!r}. Pass an MJCF .xml or a compiled .mjb.")
    suffix = path.suffix.lower()
    try:
        if suffix == ".mjb":
            return mujoco.MjModel.from_binary_path(str(path))
        if suffix == ".xml":
            return mujoco.MjModel.from_xml_path(str(path))
    except (ValueError, RuntimeError) as err:
        raise ModelLoadError(f"MuJoCo could not load {str(path)!r}: {err}") from None
    raise ModelLoadError(
        f"{str(path)!r} has suffix {suffix!r}; the model must be an MJCF .xml or a compiled .mjb."
    )


def save_mjb(model: mujoco.MjModel, path: str | Path) -> Path:
    """Write ``model`` as a compiled ``.mjb`` (exact; tied to this MuJoCo version).

    XML would round numbers to 6 significant digits, which moves replayed pixels.

    Returns:
        The path written (missing parent folders are created).
    """
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    mujoco.mj_saveModel(model, str(path), None)
    return path


def model_bytes(model: mujoco.MjModel) -> bytes:
    """The compiled model as MJB bytes (exact; how a model travels to workers)."""
    buffer = np.empty(mujoco.mj_sizeModel(model), dtype=np.uint8)
    mujoco.mj_saveModel(model, None, buffer)
    return buffer.tobytes()


def model_from_bytes(blob: bytes) -> mujoco.MjModel:
    """The model from its MJB bytes (see :func:`model_bytes`), cached by content.

    Raises:
        ModelLoadError: the bytes are not an MJB this MuJoCo can load.
    """
    return _model_from_bytes(hashlib.sha256(blob).hexdigest(), blob)


@functools.lru_cache(maxsize=8)
def _model_from_bytes(digest: str, blob: bytes) -> mujoco.MjModel:
    name = f"{digest}.mjb"  # loaded from memory through MuJoCo's asset map: no file
    try:
        return mujoco.MjModel.from_binary_path(name, assets={name: blob})
    except (ValueError, RuntimeError) as err:
        raise ModelLoadError(
            f"MuJoCo {mujoco.__version__} could not load the model bytes (sha256 {digest[:12]}...): "
            f"{err}. Pass a model compiled by this MuJoCo version."
        ) from None


def camera_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """The names of the model's cameras, in id order (unnamed ones as ``camera{i}``)."""
    return tuple(
        mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) or f"camera{i}"
        for i in range(model.ncam)
    )


def camera_ids(model: mujoco.MjModel, cameras: str | Sequence[str]) -> tuple[int, ...]:
    """The ids of named cameras, in the order asked.

    Raises:
        CameraNotFoundError: no camera asked for, an unknown name (the message lists the
            model's cameras), or a camera named twice.
    """
    names = (cameras,) if isinstance(cameras, str) else tuple(cameras)
    existing = camera_names(model)
    listing = ", ".join(map(repr, existing)) or "none"
    if not names:
        raise CameraNotFoundError(
            f"No camera was asked for. Cameras: {listing}. Pass at least one camera name."
        )
    for name in names:
        if not isinstance(name, str) or name not in existing:
            raise CameraNotFoundError(
                f"No camera {name!r} in the model. Cameras: {listing}. "
                "Pass one of them, or add a camera to the model before compiling it."
            )
    if len(set(names)) != len(names):
        raise CameraNotFoundError(f"Cameras {names!r} name one camera twice. Pass each camera once.")
    return tuple(existing.index(name) for name in names)
