"""Load the MuJoCo model that replay and import need (the archive never holds it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import mujoco

from flyarchive.errors import CameraNotFoundError, ModelLoadError

__all__ = ["load_model", "camera_names", "camera_ids"]


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
