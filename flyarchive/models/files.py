"""Model files you trust, loaded in this process: :func:`load_model_file`.

A file is trusted because you name it: MJCF is parsed and compiled here, an MJB loaded
here. What an archive keeps is untrusted input and is loaded another way
(:func:`flyarchive.models.load_kept_model`: checked in a child process first).
"""

from __future__ import annotations

import os
from pathlib import Path

import mujoco

from flyarchive.errors import ModelLoadError
from flyarchive.models.mjb import check_data, load_mjb
from flyarchive.models.portable import compile_spec_zip


def load_model_file(path: str | os.PathLike[str]) -> mujoco.MjModel:
    """Load a model file you trust, in this process: an MJCF ``.xml`` (with its assets
    beside it), a spec zip (``.mjz``/``.zip``: an MJCF and its files,
    :mod:`flyarchive.models.spec_zip`) or a compiled ``.mjb``.

    The model an archive keeps is not a file you trust: load it with
    :func:`flyarchive.models.load_kept_model` (checked in a child process first).

    Args:
        path: The file (a local path).

    Returns:
        The compiled model (host memory).

    Raises:
        ModelLoadError: no such file, an unknown suffix, a spec zip that is refused, or
            MuJoCo refuses the model (also with ``mujoco.FatalError``, loading it or making
            its data: :func:`~flyarchive.models.mjb.check_data`).
    """
    path = Path(path)
    if not path.is_file():
        archive = (f" It is an archive: load the model it keeps with "
                   f"flyarchive.load_kept_model({str(path)!r}).") \
            if (path / "zarr.json").is_file() else ""
        raise ModelLoadError(f"No model file at {str(path)!r}. Pass an MJCF .xml, a spec zip "
                             f"(.mjz) or a compiled .mjb.{archive}")
    suffix = path.suffix.lower()
    if suffix in (".mjb", ".mjz", ".zip"):
        try:
            blob = path.read_bytes()
        except OSError as err:
            raise ModelLoadError(f"Cannot read the model file {str(path)!r} ({err}).") from None
        model = load_mjb(blob, repr(str(path))) if suffix == ".mjb" else \
            compile_spec_zip(blob, f"the spec zip {str(path)!r}", closed=False)
    elif suffix == ".xml":
        try:
            model = mujoco.MjModel.from_xml_path(str(path))
        except (ValueError, RuntimeError, mujoco.FatalError) as err:
            raise ModelLoadError(f"MuJoCo could not load {str(path)!r}: {err}") from None
    else:
        raise ModelLoadError(
            f"{str(path)!r} has suffix {suffix!r}; the model must be an MJCF .xml, a spec zip "
            "(.mjz, .zip) or a compiled .mjb."
        )
    check_data(model, repr(str(path)))
    return model
