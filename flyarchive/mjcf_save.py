"""Save a compiled model exactly, for replay later (the archive never holds it)."""

from __future__ import annotations

from pathlib import Path

import mujoco

__all__ = ["save_mjb"]


def save_mjb(model: mujoco.MjModel, path: str | Path) -> Path:
    """Write ``model`` as a compiled ``.mjb`` (exact; tied to this MuJoCo version).

    XML would round numbers to 6 significant digits, which moves replayed pixels.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mujoco.mj_saveModel(model, str(path), None)
    return path
