"""A model read from an archive is untrusted input: it is loaded (a spec zip: compiled)
first in a short-lived child process, and the verdict is remembered by the model's hash.

MuJoCo's binary model loader is not memory-safe on crafted files: an ``.mjb`` whose
bytes were edited can crash the process that loads it (SIGSEGV) or make MuJoCo raise
``mujoco.FatalError``, and the hash of a kept model only proves that its bytes are the
ones its name says, not who wrote them. So before a kept model is loaded into a
long-lived process (a render, ``load_kept_model``, ``verify``), :func:`check_model` runs
:mod:`flyarchive.models.child` in a child process, limited in address space and
time: it loads the bytes, makes an ``MjData``, runs replay's position stages and a scene
update. A crash, a ``FatalError``, or a child that does not finish becomes one
:class:`~flyarchive.errors.UnsafeModelError` naming the file and what happened; a model
MuJoCo refuses cleanly (truncated...) a :class:`~flyarchive.errors.ModelLoadError`.

A kept portable model (a MuJoCo spec zip, :mod:`flyarchive.models.spec_zip`) is compiled the
same way, by :func:`compiled_model`: the child reads the zip with bounds, checks that its
MJCF names only files it holds, compiles it from memory, writes the MJB, and runs the
stages above on that MJB. The MJB is kept in the cache: it is the model's compiled form on
this MuJoCo release, so each release compiles a portable model once.

The child runs this process's interpreter with this process's import path (``sys.path``,
the working folder left out; ``python -I`` would ignore ``PYTHONPATH``, where some
machines install MuJoCo), in a temporary folder.

The cache (:func:`flyarchive.config.cache_folder`): ``model-checks/<sha256>.<loader>.c<check>.json``,
one small JSON file per model, loader (MuJoCo's version and the machine's architecture)
and :data:`CHECK_VERSION`, and ``compiled/<sha256>.<loader>.c<check>.mjb`` for portable
models. Its content decides whether a crafted model reaches this process, so it is
trusted only from a folder that only this user can write (:func:`trusted_cache`: owned by
the user, not writable by group or others; the folder is made private, mode 0700): a
folder that fails this is neither read nor written, with an
:class:`~flyarchive.errors.UntrustedCacheWarning`, and every kept model is checked each
time. Each verdict carries an HMAC-SHA256 of its fields under a key kept in the folder
(``verdict-key``, mode 0600), and names the hash of the MJB compiled with it: an edited
verdict, one copied from elsewhere or a swapped MJB is not used (the check runs again).
Files are written atomically (a temporary file, then a rename); a cache that cannot be
read or written is not an error: the check then runs each time. A verdict of a child that
timed out or could not start is not kept. What this process learnt (verdicts, compiled
models) is also kept in memory (:class:`~flyarchive.lru.LRUCache` s), so that a folder that
cannot be written is not asked again.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
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
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mujoco

from flyarchive.config import cache_folder
from flyarchive.errors import ModelLoadError, UnsafeModelError, UntrustedCacheWarning
from flyarchive.lru import LRUCache
from flyarchive.models.mjb import check_mjb
from flyarchive.models.spec_zip import declared_bytes

#: What the child does; a kept verdict of another version of the check is checked again.
#: 2: spec zips compiled; verdicts signed; the caller's import path.
CHECK_VERSION = 2
#: Seconds the child may take (start, import MuJoCo, load or compile, one pass):
#: NeuroMechFly's MJB takes about 1 s on a busy 2-core VM, its spec zip about 2 s.
CHECK_TIMEOUT_S = 60.0
#: Largest verdict file read back, bytes.
_MAX_VERDICT_BYTES = 64 << 10
#: Largest compiled model read back from the child or the cache, bytes.
MAX_COMPILED_BYTES = 1 << 30
_CHILD = Path(__file__).with_name("child.py")
#: The key that signs verdicts, in the cache folder.
KEY_NAME = "verdict-key"
#: What each stage of the child is, in words ("... crashed with SIGSEGV").
_STAGES = {"unpack": "reading the spec zip", "parse": "MuJoCo's MJCF parser",
           "compile": "MuJoCo's model compiler", "load": "MuJoCo's model loader",
           "data": "making the model's MjData",
           "kinematics": "the model's kinematics (mj_kinematics and the position stages)",
           "scene": "the model's scene update (mjv_updateScene)"}
#: Stages where a ValueError is a clean refusal of the input (a ModelLoadError), not a
#: sign that the model is unsafe.
_CLEAN_STAGES = frozenset({"unpack", "parse", "compile", "load"})
#: Verdicts kept in this process (a few hundred bytes each), at most.
MAX_VERDICTS_HERE = 256
#: Verdicts already known in this process, by their file (:func:`verdict_path`): a cache
#: folder that cannot be written is not asked again.
_KNOWN: LRUCache[Path, Verdict] = LRUCache(MAX_VERDICTS_HERE, name="model verdicts")
#: Compiled models kept in this process, at most.
MAX_COMPILED_HERE = 4
#: Compiled models already known in this process, by their verdict's file.
_COMPILED: LRUCache[Path, bytes] = LRUCache(MAX_COMPILED_HERE, name="compiled models")
#: Cache folders already warned about in this process.
_WARNED: set[Path] = set()


@dataclass(frozen=True)
class Verdict:
    """What loading (or compiling) one model in a child process did.

    Attributes:
        sha256: The SHA-256 (hex) of the model's bytes (MJB, or spec zip).
        loader: MuJoCo's version and the machine, e.g. ``"mujoco-3.16.0-x86_64"``.
        verdict: ``"ok"``, ``"refused"`` (MuJoCo, or the zip reader, refused the bytes
            cleanly: a ``ModelLoadError``) or ``"unsafe"`` (a crash, a fatal error, a
            timeout).
        stage: The child's stage when it ended (``"unpack"``, ``"parse"``,
            ``"compile"``, ``"load"``, ``"data"``, ``"kinematics"``, ``"scene"``); None
            when ``"ok"``.
        what: What happened, in words (e.g. ``"MuJoCo's model loader crashed with
            SIGSEGV"``); empty when ``"ok"``.
        seconds: Wall time of the child, s.
        check: :data:`CHECK_VERSION` of the check that produced it.
        compiled: For a spec zip judged ``"ok"``: the SHA-256 of the MJB compiled from it
            (kept beside the verdict); else None.
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
    compiled: str | None = None
    keep: bool = True


def forget() -> None:
    """Forget the verdicts and compiled models this process knows (the cache folder is
    left as it is): the next check of each model reads the folder, or runs its child, as a
    new process would."""
    _KNOWN.clear()
    _COMPILED.clear()


def loader() -> str:
    """This process's model loader: MuJoCo's version and the machine's architecture."""
    return f"mujoco-{mujoco.__version__}-{platform.machine() or 'unknown'}"


def _key_of(sha256: str) -> str:
    """``<sha256>.<loader>.c<check>``: what a verdict and a compiled model are kept by."""
    return f"{sha256}.{loader()}.c{CHECK_VERSION}"


def verdict_path(sha256: str, folder: Path | None = None) -> Path:
    """The file of a model's verdict for this loader and check, under ``folder`` (default:
    the cache folder, :func:`flyarchive.config.cache_folder`)."""
    return (folder or cache_folder()) / "model-checks" / f"{_key_of(sha256)}.json"


def compiled_path(sha256: str, folder: Path | None = None) -> Path:
    """The file of the MJB compiled from the spec zip ``sha256`` by this loader, under
    ``folder`` (default: the cache folder)."""
    return (folder or cache_folder()) / "compiled" / f"{_key_of(sha256)}.mjb"


def child_memory(n_bytes: int) -> int:
    """Address space the child may use for a model of ``n_bytes``, bytes (an MJB's size, or
    the uncompressed size a spec zip declares): 2 GiB for the interpreter and MuJoCo, plus
    32 times the model, at most 8 GiB more (NeuroMechFly: 23 MB of MJB, about 0.3 GB of
    address space for its model and data; 5.8 MB of meshes in its spec zip)."""
    return (2 << 30) + min(32 * n_bytes, 8 << 30)


# ----------------------------------------------------------------------------- the cache's trust
def trusted_cache(folder: Path | None = None, *, create: bool = False) -> Path | None:
    """The cache folder, if only this user can write it; None if it cannot be used.

    Trusted: a folder owned by this user and not writable by its group or others. A folder
    that fails this is not used, with an :class:`~flyarchive.errors.UntrustedCacheWarning`
    (once per folder and process). A missing one is made with ``create`` (mode 0700; its
    missing parents as usual); one that cannot be made or read is not used, silently.

    Args:
        folder: The folder (default: :func:`flyarchive.config.cache_folder`).
        create: Make it when missing.
    """
    folder = folder or cache_folder()
    try:
        if create:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    problem = _writable_by_others(st)
    if problem is None:
        return folder
    if folder not in _WARNED:
        _WARNED.add(folder)
        warnings.warn(
            f"flyarchive's cache folder {str(folder)!r} {problem}: the model checks and compiled "
            "models kept there are not trusted, and none is kept there (each kept model is "
            f"checked in a child process every time). Make it private (chmod 700 {folder}), or "
            "set FLYARCHIVE_CACHE_DIR to a folder only you can write.",
            UntrustedCacheWarning, stacklevel=3,
        )
    return None


def _writable_by_others(st: os.stat_result) -> str | None:
    """Why a file or folder with status ``st`` can be written by someone other than this
    user, in words; None when it cannot."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by its group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _open_private(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link) of at most ``max_bytes``
    that only this user can write, in a folder only this user can write; else None."""
    try:
        if _writable_by_others(path.parent.lstat()) is not None or path.parent.is_symlink():
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes \
                    or _writable_by_others(st) is not None:
                return None
            return f.read(max_bytes + 1)
    except OSError:
        return None


def _signing_key(folder: Path, *, create: bool) -> bytes | None:
    """The key that signs the verdicts kept in ``folder`` (32 random bytes, mode 0600,
    readable by this user only), made when missing with ``create``; None when there is none
    that can be used."""
    path = folder / KEY_NAME
    key = _open_private(path, 64)
    if key is None and create and not path.exists() and not path.is_symlink():
        temporary = None
        try:
            fd, temporary = tempfile.mkstemp(dir=folder, prefix=".key-")
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
            os.link(temporary, path)  # fails if another process made it first: theirs is used
        except OSError:
            pass
        finally:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
        key = _open_private(path, 64)
    if key is None or len(key) != 32:
        return None
    with contextlib.suppress(OSError):
        if stat.S_IMODE(path.lstat().st_mode) & 0o077:  # readable by others: they could sign
            return None
    return key


def _signature(key: bytes, fields: dict[str, Any]) -> str:
    document = json.dumps({k: v for k, v in fields.items() if k not in ("mac", "keep")},
                          sort_keys=True, separators=(",", ":"))
    return hmac.new(key, document.encode(), hashlib.sha256).hexdigest()


# ----------------------------------------------------------------------------- an MJB
def check_model(blob: bytes, where: str, *, sha256: str | None = None,
                cache: Path | None = None, timeout_s: float = CHECK_TIMEOUT_S) -> Verdict:
    """Check that this process can load the MJB bytes ``blob`` safely; the verdict.

    The header is checked here (:func:`flyarchive.models.mjb.check_mjb`); the rest in a child
    process, unless a verdict for these bytes, this loader and this check is kept in a
    trusted cache (:func:`trusted_cache`).

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
    verdict, _ = _judged(digest, lambda: blob, "mjb", cache, timeout_s)
    _raise_unless_ok(verdict, where)
    return verdict


# ----------------------------------------------------------------------------- a spec zip
def compiled_model(read: Callable[[], bytes], sha256: str, where: str, *,
                   cache: Path | None = None, timeout_s: float = CHECK_TIMEOUT_S
                   ) -> tuple[bytes, Verdict]:
    """The MJB that this MuJoCo compiles the spec zip ``sha256`` to, compiled and checked in
    a child process once per loader and kept in the cache; and the verdict.

    Args:
        read: Returns the zip's bytes (already checked against ``sha256``); called only when
            no compiled model is kept.
        sha256: The zip's SHA-256 (hex).
        where: The zip, for messages (e.g. ``"/data/run.zarr/models/<sha256>.mjz"``).
        cache: The cache folder (default: :func:`flyarchive.config.cache_folder`).
        timeout_s: Seconds the child may take.

    Returns:
        The compiled model's MJB bytes (this release's: safe to load here) and the verdict.

    Raises:
        ModelLoadError: the zip is refused (not a zip, a bomb, names that leave it, links,
            an MJCF that names files it does not hold) or MuJoCo refused the MJCF, with
            the reason.
        UnsafeModelError: compiling or loading it crashed the child, raised
            ``mujoco.FatalError`` (or ran out of memory), or did not finish within
            ``timeout_s``.
    """
    verdict, compiled = _judged(sha256, read, "mjz", cache, timeout_s)
    _raise_unless_ok(verdict, where)
    assert compiled is not None  # an "ok" verdict of a spec zip comes with its MJB
    return compiled, verdict


# ----------------------------------------------------------------------------- verdicts
def _judged(sha256: str, read: Callable[[], bytes], form: str, cache: Path | None,
            timeout_s: float) -> tuple[Verdict, bytes | None]:
    """The verdict on the model ``sha256`` (and its compiled MJB, for a spec zip): known in
    this process, kept in a trusted cache, or from a child process (then kept)."""
    folder = trusted_cache(cache)
    path = verdict_path(sha256, folder or cache)
    verdict = _KNOWN.peek(path)
    if verdict is None and folder is not None:
        verdict = _read_verdict(path, sha256, folder)
    compiled = None
    if verdict is not None and form == "mjz" and verdict.verdict == "ok":
        compiled = _COMPILED.peek(path) or _read_compiled(sha256, verdict.compiled, folder)
        if compiled is None:
            verdict = None  # the verdict's MJB is gone or was changed: compile again
    if verdict is None:
        if form == "mjb":
            verdict = run_child(read(), sha256, timeout_s)
        else:
            verdict, compiled = compile_in_child(read(), sha256, timeout_s)
        if verdict.keep:
            _keep(verdict, compiled, cache)
    if verdict.keep:
        _KNOWN.put(path, verdict)
        if compiled is not None:
            _COMPILED.put(path, compiled)
    return verdict, compiled


def _raise_unless_ok(verdict: Verdict, where: str) -> None:
    if verdict.verdict == "refused" and verdict.stage in ("unpack", "parse", "compile"):
        raise ModelLoadError(
            f"MuJoCo {mujoco.__version__} could not compile the portable model {where!r}: "
            f"{verdict.what}. Pass --model to use a model you trust (API: model=...)."
        )
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


def child_path() -> list[str]:
    """The import path the child gets: this process's ``sys.path``, made absolute, without
    the working folder (``""``, or an entry that is it)."""
    here = os.getcwd()
    out = []
    for entry in sys.path:
        if not entry or not isinstance(entry, str):
            continue
        absolute = os.path.abspath(entry)
        if absolute != here and absolute not in out:
            out.append(absolute)
    return out


def run_child(blob: bytes, sha256: str, timeout_s: float = CHECK_TIMEOUT_S) -> Verdict:
    """Load the MJB ``blob`` in a child process (:mod:`flyarchive.models.child`) and
    judge what happened; nothing is kept."""
    return _run(blob, sha256, timeout_s, "mjb")[0]


def compile_in_child(blob: bytes, sha256: str, timeout_s: float = CHECK_TIMEOUT_S
                     ) -> tuple[Verdict, bytes | None]:
    """Compile the spec zip ``blob`` in a child process, which checks the MJB it writes as
    :func:`run_child` checks one; the verdict, and the MJB when it is ``"ok"`` (else None).
    Nothing is kept."""
    return _run(blob, sha256, timeout_s, "mjz")


def _run(blob: bytes, sha256: str, timeout_s: float, form: str) -> tuple[Verdict, bytes | None]:
    env = {**os.environ, "MUJOCO_GL": "disable"}  # no OpenGL library is loaded
    size = len(blob) if form == "mjb" else max(len(blob), declared_bytes(blob))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flyarchive-model-check-") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-I", str(_CHILD), str(child_memory(size)),
                 str(math.ceil(timeout_s)), form, json.dumps(child_path())],
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
                           time.perf_counter() - start, keep=False), None
        verdict = _judge(sha256, done, time.perf_counter() - start, timeout_s)
        if form != "mjz" or verdict.verdict != "ok":
            return verdict, None
        compiled = _read_regular(Path(folder, "compiled.mjb"), MAX_COMPILED_BYTES)
    if compiled is None:
        raise ModelLoadError(
            f"flyarchive could not read the model that a child process compiled from "
            f"{sha256[:12]}... (no compiled.mjb of at most {MAX_COMPILED_BYTES:,} bytes). "
            "Pass --model to use a model you trust (API: model=...)."
        )
    digest = hashlib.sha256(compiled).hexdigest()
    return Verdict(sha256, loader(), "ok", seconds=verdict.seconds, compiled=digest), compiled


def _read_regular(path: Path, max_bytes: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        return f.read(max_bytes + 1)


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
        clean = last.get("value") is True and stage in _CLEAN_STAGES
        what = (str(last.get("message")) if clean else
                f"{_STAGES[stage]} raised {_error_name(last.get('error'))}: {last.get('message')}")
        return Verdict(sha256, loader(), "refused" if clean else "unsafe", stage, what, seconds)
    if done.returncode == -signal.SIGXCPU:  # its CPU time ran out: as a timeout
        return Verdict(sha256, loader(), "unsafe", stage,
                       f"{_STAGES[stage]} did not finish within {math.ceil(timeout_s)} s of CPU "
                       "time (stopped)", seconds, keep=False)
    ended = (f"crashed with {_signal_name(-done.returncode)}" if done.returncode < 0 else
             f"ended the process with status {done.returncode}")
    return Verdict(sha256, loader(), "unsafe", stage, f"{_STAGES[stage]} {ended}", seconds)


def _error_name(name: Any) -> str:
    """``FatalError`` -> ``mujoco.FatalError``; Python's own errors as they are."""
    return f"mujoco.{name}" if name == "FatalError" else str(name)


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


def _read_verdict(path: Path, sha256: str, folder: Path) -> Verdict | None:
    """The verdict kept at ``path`` for the model ``sha256``, this loader and this check;
    None when there is none that can be used (missing, not a regular file only this user
    can write, too large, malformed, unsigned or signed otherwise, of another model, check
    or loader)."""
    key = _signing_key(folder, create=False)
    raw = _open_private(path, _MAX_VERDICT_BYTES) if key is not None else None
    if raw is None:
        return None
    try:
        fields = json.loads(raw)
        if not isinstance(fields, dict) or not isinstance(fields.get("mac"), str) or \
                not hmac.compare_digest(fields["mac"], _signature(key, fields)):
            return None
        verdict = Verdict(**{k: fields[k] for k in ("sha256", "loader", "verdict", "stage",
                                                    "what", "seconds", "check", "compiled")})
    except (ValueError, TypeError, KeyError):
        return None
    sound = (verdict.sha256 == sha256 and verdict.loader == loader()
             and verdict.check == CHECK_VERSION and verdict.verdict in ("ok", "refused", "unsafe")
             and (verdict.stage is None or verdict.stage in _STAGES)
             and isinstance(verdict.what, str)
             and (verdict.compiled is None or isinstance(verdict.compiled, str)))
    return verdict if sound else None


def _read_compiled(sha256: str, digest: str | None, folder: Path | None) -> bytes | None:
    """The compiled MJB kept for the spec zip ``sha256``, if its bytes hash to ``digest``."""
    if folder is None or digest is None:
        return None
    blob = _open_private(compiled_path(sha256, folder), MAX_COMPILED_BYTES)
    if blob is None or hashlib.sha256(blob).hexdigest() != digest:
        return None
    return blob


def _keep(verdict: Verdict, compiled: bytes | None, cache: Path | None) -> None:
    """Keep ``verdict`` (and the MJB compiled with it) in the cache, if it is trusted: the
    MJB first, then the verdict that names it (each atomically: a temporary file renamed)."""
    folder = trusted_cache(cache, create=True)
    key = _signing_key(folder, create=True) if folder is not None else None
    if folder is None or key is None:
        return
    if compiled is not None and not _write_file(compiled_path(verdict.sha256, folder), compiled):
        return
    fields = {k: v for k, v in asdict(verdict).items() if k != "keep"}
    fields["mac"] = _signature(key, fields)
    _write_file(verdict_path(verdict.sha256, folder), json.dumps(fields).encode())


def _write_file(path: Path, data: bytes) -> bool:
    """Write ``data`` at ``path`` atomically, in a private folder (made 0700 when missing);
    False when the folder cannot be written (it is left as it is)."""
    temporary = None
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        if _writable_by_others(path.parent.lstat()) is not None or path.parent.is_symlink():
            return False
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".kept-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
        return True
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return False
