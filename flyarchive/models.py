"""Load the MuJoCo model that replay and import need (the archive never holds it)."""

from __future__ import annotations

from pathlib import Path

import mujoco

from flyarchive.errors import ModelLoadError

__all__ = ["load_model"]


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
