"""What a MuJoCo release changed in a model's visual defaults, pinned back for replay to
what the release that recorded an archive used.

An archive names the MuJoCo it was recorded with (the root attribute ``versions``). A model
compiled by another release may carry that release's defaults; replay keeps the pictures of
the recording's release where a default changed:

- the headlight (``<visual><headlight active>``, ``mjModel.vis.headlight.active``): MuJoCo
  4.0 added the value 2, ``"auto"`` ("the runtime decides", its changelog), and made it the
  default where releases before 4.0 compiled 1 (on). MuJoCo 4's classic renderer and
  mujoco-warp 4.0 draw ``"auto"`` as on; a renderer that draws it otherwise would change
  the frames of every archive recorded before 4.0. Replay of such an archive turns an
  ``"auto"`` headlight on, as its release did; an explicit 0 or 1 in the model is kept.

An archive recorded under MuJoCo 4 replayed under 3.16 needs nothing: 3.16 has no
``"auto"``, and compiles the default as on, which is how MuJoCo 4's renderers drew it.
Compared with the defaults MuJoCo 3.16 compiles, MuJoCo 4.0.1 changed no other visual field
of the tiny test model or of NeuroMechFly (every field of ``mjModel.vis``, ``stat``,
lights, materials, textures and geoms compared).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import mujoco

#: ``mjModel.vis.headlight.active`` of MuJoCo 4's ``"auto"`` headlight.
HEADLIGHT_AUTO = 2
#: ``mjModel.vis.headlight.active`` that releases before 4.0 compiled by default (on).
HEADLIGHT_ON = 1


def recorded_release(attrs: Mapping[str, Any]) -> tuple[int, int] | None:
    """The MuJoCo release an archive was recorded with, ``(major, minor)``, from its root
    attributes; None when the archive does not say (an archive written without MuJoCo's
    version, or a version that is not ``MAJOR.MINOR...``)."""
    versions = attrs.get("versions")
    text = versions.get("mujoco") if isinstance(versions, Mapping) else None
    found = re.match(r"(\d+)\.(\d+)", text) if isinstance(text, str) else None
    return (int(found[1]), int(found[2])) if found else None


def pin_release_defaults(model: mujoco.MjModel,
                         recorded: tuple[int, int] | None) -> mujoco.MjModel:
    """``model`` with the visual defaults of the release that recorded an archive.

    Args:
        model: The compiled model replay renders with (never modified).
        recorded: The recording's MuJoCo release, from :func:`recorded_release`; None
            (unknown): ``model`` as it is.

    Returns:
        ``model`` itself when nothing differs, else a copy whose fields the module's
        docstring names are set as the recording's release set them.
    """
    if recorded is None or recorded >= (4, 0):
        return model
    if model.vis.headlight.active != HEADLIGHT_AUTO:
        return model
    pinned = copy.copy(model)
    pinned.vis.headlight.active = HEADLIGHT_ON
    return pinned
