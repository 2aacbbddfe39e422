"""A compiled model read from an archive is untrusted input: it is loaded first in a
short-lived child process, and the verdict is remembered by the model's hash.

MuJoCo's binary model loader is not memory-safe on crafted files: an ``.mjb`` whose
bytes were edited can crash the process that loads it (SIGSEGV) or make MuJoCo raise
``mujoco.FatalError``, and the hash of a kept model only proves that its bytes are the
ones its name says, not who wrote them. So before a kept model is loaded into a
long-lived process (a render, ``load_model``, ``verify``), :func:`check_model` runs
:mod:`flyarchive.store.model_child` in a child process, limited in address space and
time: it loads the bytes, makes an ``MjData``, runs replay's position stages and a scene
update. A crash, a ``FatalError``, or a child that does not finish becomes one
:class:`~flyarchive.errors.UnsafeModelError` naming the file and what happened; a model
MuJoCo refuses cleanly (truncated...) a :class:`~flyarchive.errors.ModelLoadError`.

The verdict is kept in the user's cache folder (:func:`flyarchive.config.cache_folder`),
one small JSON file per model and loader: ``model-checks/<sha256>.<loader>.json``, where
the loader is MuJoCo's version and the machine's architecture (a verdict is valid only
for the loader that produced it). Files are written atomically (a temporary file, then a
rename); a cache that cannot be read or written is not an error: the check then runs
each time. A verdict of a child that timed out or could not start is not kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mujoco

from flyarchive.config import cache_folder
from flyarchive.errors import ModelLoadError, UnsafeModelError
from flyarchive.models import check_mjb

#: What the child does; a kept verdict of another version of the check is checked again.
CHECK_VERSION = 1
#: Seconds the child may take (start, import MuJoCo, load, one pass): NeuroMechFly's
#: takes about 1 s on a busy 2-core VM.
CHECK_TIMEOUT_S = 60.0
#: Largest verdict file read back, bytes.
_MAX_VERDICT_BYTES = 64 << 10
_CHILD = Path(__file__).with_name("model_child.py")
#: What each stage of the child is, in words ("... crashed with SIGSEGV").
_STAGES = {"load": "MuJoCo's model loader", "data": "making the model's MjData",
           "kinematics": "the model's kinematics (mj_kinematics and the position stages)",
           "scene": "the model's scene update (mjv_updateScene)"}
#: Verdicts already known in this process, by their file (:func:`verdict_path`): a cache
#: folder that cannot be written is not asked again.
_KNOWN: dict[Path, Verdict] = {}


@dataclass(frozen=True)
class Verdict:
    """What loading one model in a child process did.

    Attributes:
        sha256: The model's MJB bytes' SHA-256 (hex).
        loader: MuJoCo's version and the machine, e.g. ``"mujoco-3.16.0-x86_64"``.
        verdict: ``"ok"``, ``"refused"`` (MuJoCo refused the bytes cleanly: a
            ``ModelLoadError``) or ``"unsafe"`` (a crash, a fatal error, a timeout).
        stage: The child's stage when it ended (``"load"``, ``"data"``, ``"kinematics"``,
            ``"scene"``); None when ``"ok"``.
        what: What happened, in words (e.g. ``"MuJoCo's model loader crashed with
            SIGSEGV"``); empty when ``"ok"``.
        seconds: Wall time of the child, s.
        check: :data:`CHECK_VERSION` of the check that produced it.
        keep: Whether the verdict may be kept (not a timeout, nor a child that could not
            start).
    """

    sha256: str
    loader: str
    verdict: str
    stage: str | None = None
    what: str = ""
    seconds: float = 0.0
    check: int = CHECK_VERSION
    keep: bool = True


def loader() -> str:
    """This process's model loader: MuJoCo's version and the machine's architecture."""
    return f"mujoco-{mujoco.__version__}-{platform.machine() or 'unknown'}"


def verdict_path(sha256: str, folder: Path | None = None) -> Path:
    """The file of a model's verdict for this loader, under ``folder`` (default: the cache
    folder, :func:`flyarchive.config.cache_folder`)."""
    return (folder or cache_folder()) / "model-checks" / f"{sha256}.{loader()}.json"


def child_memory(n_bytes: int) -> int:
    """Address space the child may use for a model of ``n_bytes``, bytes: 2 GiB for the
    interpreter and MuJoCo, plus 32 times the model (NeuroMechFly: 23 MB of MJB, about
    0.3 GB of address space for its model and data)."""
    return (2 << 30) + 32 * n_bytes


def check_model(blob: bytes, where: str, *, sha256: str | None = None,
                cache: Path | None = None, timeout_s: float = CHECK_TIMEOUT_S) -> Verdict:
    """Check that this process can load the MJB bytes ``blob`` safely; the verdict.

    The header is checked here (:func:`flyarchive.models.check_mjb`); the rest in a child
    process, unless a verdict for these bytes and this loader is kept.

    Args:
        blob: The model's MJB bytes, as read (and already checked against its name).
        where: The file, for messages (e.g. ``"/data/run.zarr/models/<sha256>.mjb"``).
        sha256: ``blob``'s SHA-256 when the caller has it (else computed).
        cache: The cache folder (default: :func:`flyarchive.config.cache_folder`).
        timeout_s: Seconds the child may take.

    Returns:
        The verdict, ``"ok"``.

    Raises:
        ModelLoadError: not an MJB of this MuJoCo (its header), or MuJoCo refused the bytes
            (truncated, inconsistent sizes...), with MuJoCo's reason.
        UnsafeModelError: loading them crashed the child (a signal), raised
            ``mujoco.FatalError``, or did not finish within ``timeout_s``.
    """
    check_mjb(blob, repr(where))
    digest = sha256 or hashlib.sha256(blob).hexdigest()
    path = verdict_path(digest, cache)
    verdict = _KNOWN.get(path) or _read_verdict(path, digest)
    if verdict is None:
        verdict = run_child(blob, digest, timeout_s)
        if verdict.keep:
            _write_verdict(verdict, path)
    if verdict.keep:
        _KNOWN[path] = verdict
    if verdict.verdict == "refused":
        raise ModelLoadError(
            f"MuJoCo {mujoco.__version__} could not load {where!r}: {verdict.what}. The file "
            "is damaged or truncated. Pass --model to use a model you trust (API: model=...)."
        )
    if verdict.verdict != "ok":
        raise UnsafeModelError(
            f"The model {where!r} is not safe to load: {verdict.what}. flyarchive did not load "
            "it into this process. Pass --model to use a model you trust (API: model=...)."
        )
    return verdict


def run_child(blob: bytes, sha256: str, timeout_s: float = CHECK_TIMEOUT_S) -> Verdict:
    """Load ``blob`` in a child process (:mod:`flyarchive.store.model_child`) and judge
    what happened; nothing is kept."""
    env = {**os.environ, "MUJOCO_GL": "disable"}  # no OpenGL library is loaded
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flyarchive-model-check-") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-I", str(_CHILD), str(child_memory(len(blob))),
                 str(math.ceil(timeout_s))],
                input=blob, capture_output=True, timeout=timeout_s, cwd=folder, env=env,
            )
        except OSError as err:  # no process could be started: not the model's doing
            raise ModelLoadError(
                f"flyarchive could not start a process to check the model {sha256[:12]}... "
                f"({err}). Pass --model to use a model you trust (API: model=...)."
            ) from None
        except subprocess.TimeoutExpired as err:
            stage = _last(err.stdout or b"").get("stage", "load")
            return Verdict(sha256, loader(), "unsafe", stage,
                           f"{_STAGES[stage]} did not finish within {timeout_s:g} s (killed)",
                           time.perf_counter() - start, keep=False)
    return _judge(sha256, done, time.perf_counter() - start, timeout_s)


def _judge(sha256: str, done: subprocess.CompletedProcess[bytes], seconds: float,
           timeout_s: float) -> Verdict:
    """The verdict on what the child reported and how it ended."""
    last = _last(done.stdout)
    stage = last.get("stage", "load")
    if not last:  # it never began loading (no interpreter, no MuJoCo): not the model's doing
        tail = done.stderr.decode(errors="replace").strip()[-300:]
        raise ModelLoadError(
            f"flyarchive could not check the model {sha256[:12]}... in a child process: "
            f"{sys.executable} ended with status {done.returncode} before loading it "
            f"({tail!r}). Pass --model to use a model you trust (API: model=...)."
        )
    if last.get("verdict") == "ok" and done.returncode == 0:
        return Verdict(sha256, loader(), "ok", seconds=seconds)
    if last.get("verdict") == "refused":
        fatal = last.get("error") != "ValueError" or stage != "load"
        what = (f"{_STAGES[stage]} raised mujoco.{last.get('error')}: {last.get('message')}"
                if fatal else str(last.get("message")))
        return Verdict(sha256, loader(), "unsafe" if fatal else "refused", stage, what, seconds)
    if done.returncode == -signal.SIGXCPU:  # its CPU time ran out: as a timeout
        return Verdict(sha256, loader(), "unsafe", stage,
                       f"{_STAGES[stage]} did not finish within {math.ceil(timeout_s)} s of CPU "
                       "time (stopped)", seconds, keep=False)
    ended = (f"crashed with {_signal_name(-done.returncode)}" if done.returncode < 0 else
             f"ended the process with status {done.returncode}")
    return Verdict(sha256, loader(), "unsafe", stage, f"{_STAGES[stage]} {ended}", seconds)


def _last(stdout: bytes) -> dict[str, Any]:
    """The child's last JSON line (``{}`` when none)."""
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict) and found.get("stage", "load") in _STAGES:
                return found
    return {}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_verdict(path: Path, sha256: str) -> Verdict | None:
    """The verdict kept at ``path`` for the model ``sha256`` and this loader; None when there
    is none that can be used (missing, not a regular file, too large, malformed, of another
    model, check or loader)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_VERDICT_BYTES:
                return None
            fields = json.loads(f.read(_MAX_VERDICT_BYTES))
        verdict = Verdict(**{k: fields[k] for k in ("sha256", "loader", "verdict", "stage",
                                                    "what", "seconds", "check")})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    sound = (verdict.sha256 == sha256 and verdict.loader == loader()
             and verdict.check == CHECK_VERSION and verdict.verdict in ("ok", "refused", "unsafe")
             and (verdict.stage is None or verdict.stage in _STAGES)
             and isinstance(verdict.what, str))
    return verdict if sound else None


def _write_verdict(verdict: Verdict, path: Path) -> None:
    """Keep ``verdict`` at ``path`` (atomically: a temporary file renamed); a cache folder
    that cannot be written is left as it is."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".verdict-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({k: v for k, v in asdict(verdict).items() if k != "keep"}, f)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
