"""A compiled model's cameras, by name: what renders and the viewer ask for.

MuJoCo names cameras in the model; an unnamed camera is ``camera{i}`` here (its id), so
that every camera can be asked for by a name.
"""

from __future__ import annotations

from collections.abc import Sequence

import mujoco

from flyarchive.errors import CameraNotFoundError


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
