"""A compiled model's exact form, its MJB bytes: written, read in memory, its header checked.

An MJB is what ``mujoco.mj_saveModel`` writes: exact (XML would round numbers to 6
significant digits), and bound to the MuJoCo release that wrote it. It is how a model
travels to workers (:func:`model_bytes`) and how an archive keeps its exact model
(:mod:`flyarchive.models.kept`). Its header is checked before MuJoCo reads it
(:func:`check_mjb`), and MuJoCo's own reason for refusing one (which it would otherwise
append to ``MUJOCO_LOG.TXT`` in the working folder) goes into the error
(:func:`load_mjb`).

Everything here is for bytes you trust: MuJoCo's loader is not memory-safe on crafted
bytes, and an archive's kept MJB is loaded in a child process first
(:mod:`flyarchive.models.check`).
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import mujoco
import numpy as np

from flyarchive.errors import ModelLoadError

#: The first int32 of every MJB file (MuJoCo's ``ID`` in ``engine_io.c``).
MJB_ID = 54321


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


def check_data(model: mujoco.MjModel, where: str = "the model") -> None:
    """Make the model's ``MjData`` once: MuJoCo checks a compiled model's sparse matrices
    and sizes there, and raises ``mujoco.FatalError`` on a damaged one; here that is a
    :class:`ModelLoadError` (NeuroMechFly: a few milliseconds).

    Raises:
        ModelLoadError: MuJoCo cannot make the model's data, with its reason.
    """
    try:
        mujoco.MjData(model)
    except (mujoco.FatalError, MemoryError) as err:
        raise ModelLoadError(
            f"MuJoCo cannot use {where}: making its MjData raised {type(err).__name__}: {err}. "
            "The model is damaged; compile it again from its XML."
        ) from None


def _version_text(header: int) -> str:
    """``3016000`` -> ``"3.16.0"``."""
    return f"{header // 1_000_000}.{header // 1000 % 1000}.{header % 1000}"


def mujoco_release() -> str:
    """This MuJoCo's release, as its MJB headers name it (e.g. ``"3.16.0"``)."""
    return _version_text(mujoco.mjVERSION_HEADER)


def mjb_version(blob: bytes) -> str | None:
    """The MuJoCo release that wrote an MJB (e.g. ``"3.16.0"``), from its header; None
    when ``blob`` does not start with an MJB header."""
    if len(blob) < 16:
        return None
    ident, _, _, version = struct.unpack("<4i", blob[:16])
    return _version_text(version) if ident == MJB_ID else None


def check_mjb(blob: bytes, where: str) -> None:
    """Check the header of MJB bytes against this MuJoCo, before MuJoCo reads them.

    The header is four little-endian int32: the MJB id 54321, ``sizeof(mjtNum)``, the
    number of size fields of ``mjModel``, and ``mjVERSION_HEADER`` (e.g. 3016000);
    MuJoCo loads only its own release's MJB.

    Args:
        blob: The bytes.
        where: What they are, for messages (a path, or an archive's object).

    Raises:
        ModelLoadError: not an MJB (too short, or another first number: e.g. an XML
            file), or an MJB of another MuJoCo release or build.
    """
    if len(blob) < 16 or struct.unpack("<i", blob[:4])[0] != MJB_ID:
        start = blob[:16]
        hint = " (it looks like MJCF XML: load it with flyarchive.models.load_model_file('x.xml'))" \
            if blob.lstrip()[:1] == b"<" else ""
        raise ModelLoadError(
            f"{where} is not a compiled MuJoCo model (.mjb): it does not start with the MJB "
            f"id {MJB_ID} (it starts with {start!r}){hint}. Pass an .mjb written by "
            "mujoco.mj_saveModel or flyarchive.models.save_mjb."
        )
    _, real, _, version = struct.unpack("<4i", blob[:16])
    if version != mujoco.mjVERSION_HEADER:
        theirs = _version_text(version)
        raise ModelLoadError(
            f"{where} was compiled by MuJoCo {theirs}; this is MuJoCo {mujoco.__version__}, "
            "which reads only the .mjb of its own release. Recompile the model from its XML "
            f"with this MuJoCo, or install mujoco=={theirs} to replay it."
        )
    if real != 8:
        raise ModelLoadError(
            f"{where} was compiled with {real}-byte floating point numbers (mjtNum); this "
            "MuJoCo uses 8-byte ones. Recompile the model from its XML with this MuJoCo."
        )


_WARNING_LOCK = threading.Lock()  # MuJoCo's warning handler is process-wide


def load_mjb(blob: bytes, where: str = "the model") -> mujoco.MjModel:
    """Load a model from MJB bytes, in memory (no file is written, not even MuJoCo's log).

    The header is checked first (:func:`check_mjb`). While MuJoCo reads the bytes, its
    warning handler is replaced, so that its reason for refusing them (truncated
    data, sizes that differ...) goes into the error instead of ``MUJOCO_LOG.TXT`` in
    the working folder.

    Args:
        blob: The MJB bytes.
        where: What they are, for messages.

    Only for bytes you trust: MuJoCo's loader is not memory-safe on crafted bytes (an
    archive's kept model goes through :mod:`flyarchive.models.check` first).

    Raises:
        ModelLoadError: bytes that are not an MJB this MuJoCo can load, with MuJoCo's
            reason (also when MuJoCo raises ``mujoco.FatalError``).
    """
    check_mjb(blob, where)
    name = "model.mjb"  # read from MuJoCo's asset map: no file
    messages: list[str] = []
    with _WARNING_LOCK:
        previous = mujoco.get_mju_user_warning()
        mujoco.set_mju_user_warning(messages.append)
        try:
            return mujoco.MjModel.from_binary_path(name, assets={name: blob})
        except (ValueError, RuntimeError, mujoco.FatalError) as err:
            reason = "; ".join(m.strip() for m in messages) or str(err)
            raise ModelLoadError(
                f"MuJoCo {mujoco.__version__} could not load {where}: {reason}. The file is "
                "damaged or truncated; write it again from the model (save_mjb), or recompile "
                "it from its XML."
            ) from None
        finally:
            mujoco.set_mju_user_warning(previous)
