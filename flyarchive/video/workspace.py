"""Folders a render run writes besides its videos, made with a liveness marker and removed
by the next run once their owner is dead.

A render writes its segments to ``{out}/.parts-{id}/`` (a :class:`RunFolder`) and its
temporary files to one scratch folder per process, ``{tmp}/flyarchive-scratch-{pid}-*``
(:func:`scratch_dir`). A process killed mid-render leaves them behind; the next run into
the same output folder, or the next process that makes a scratch folder, removes those
whose owner is dead, and never those of a live run:

- A local folder holds ``run.lock``, which its owner keeps locked (``flock``) while it
  lives; the kernel releases the lock when the process dies, SIGKILL included. A folder
  whose lock can be taken is dead. The lock file is created under another name, locked,
  then renamed into place, so it is never seen unlocked while its owner lives.
- Object stores (S3...) have no locks: ``run.json`` holds the owner's host, pid and a
  heartbeat rewritten every :data:`HEARTBEAT_S` seconds. The run is dead when it ran on
  this host and its pid is gone, or when its heartbeat is older than :data:`STALE_S`.
- A local folder without ``run.lock`` (left by flyarchive 0.1, or by a process killed
  within microseconds of making it) is dead once :data:`LOCKLESS_GRACE_S` seconds old.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from flyarchive.errors import RenderFailedError, StorageError, missing_storage_backend

PARTS_PREFIX = ".parts-"
SCRATCH_PREFIX = "flyarchive-scratch-"
LOCK_NAME = "run.lock"
INFO_NAME = "run.json"
#: Seconds between heartbeats of a run on an object store.
HEARTBEAT_S = 30.0
#: A run on an object store whose heartbeat is this old (seconds) is dead.
STALE_S = 600.0
#: A local folder without a lock file is dead once this old (seconds).
LOCKLESS_GRACE_S = 60.0


def _host() -> str:
    """This machine: host name and boot id (a pid means something only on one boot)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _owner() -> dict[str, Any]:
    return {"host": _host(), "pid": os.getpid(), "started": time.time(), "heartbeat": time.time()}


# ----------------------------------------------------------------------------- local locks
def _hold_lock(folder: Path) -> int:
    """Create ``folder/run.lock`` already locked by this process; its file descriptor."""
    import fcntl

    staging = folder / f".lock-{uuid.uuid4().hex}"
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, folder / LOCK_NAME)
    except BaseException:
        os.close(fd)
        staging.unlink(missing_ok=True)
        raise
    return fd


def _remove_if_dead(folder: Path) -> bool:
    """Remove a local run folder if its owner is dead; whether it was removed."""
    import fcntl

    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        try:
            age = time.time() - folder.stat().st_mtime
        except OSError:
            return False
        if age < LOCKLESS_GRACE_S:
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: the owner lives
            return False
        if os.fstat(fd).st_nlink == 0:  # another sweeper removed it meanwhile
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def sweep_local(parent: str | os.PathLike[str], prefix: str, *, keep: Path | None = None
                ) -> list[str]:
    """Remove the folders ``parent/{prefix}*`` whose owner is dead.

    Args:
        parent: A local folder.
        prefix: Name prefix of the folders to look at (:data:`PARTS_PREFIX`,
            :data:`SCRATCH_PREFIX`).
        keep: A folder never to remove (the caller's own).

    Returns:
        The folders removed.
    """
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if path != keep and _remove_if_dead(path):
            removed.append(str(path))
    return removed


# ----------------------------------------------------------------------------- scratch
_scratch: tuple[int, Path, int] | None = None  # (pid, folder, lock fd) of this process
_scratch_lock = threading.Lock()


def scratch_dir() -> Path:
    """This process's scratch folder under :func:`tempfile.gettempdir`, made on first use.

    Temporary files of a render go into folders inside it. It is removed when the
    process exits; if the process is killed, the next process that makes its own scratch
    folder removes it (the dead ones of every process, see the module docstring).
    """
    global _scratch
    with _scratch_lock:
        if _scratch is None or _scratch[0] != os.getpid():  # none yet, or a forked child
            root = Path(tempfile.gettempdir())
            folder = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root))
            fd = _hold_lock(folder)
            sweep_local(root, SCRATCH_PREFIX, keep=folder)
            _scratch = (os.getpid(), folder, fd)
            atexit.register(_remove_scratch, os.getpid(), folder, fd)
        return _scratch[1]


def _remove_scratch(pid: int, folder: Path, fd: int) -> None:
    if os.getpid() != pid:  # atexit handlers are inherited by forked children
        return
    shutil.rmtree(folder, ignore_errors=True)
    os.close(fd)


# ----------------------------------------------------------------------------- run folders
def filesystem(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    """``(fsspec file system, path)`` of a URL.

    Raises:
        StorageBackendMissingError: the URL's protocol needs a package that is missing.
        StorageError: the protocol is unknown, or the options do not fit it.
    """
    from flyarchive.store import storage_errors

    try:
        return storage_errors.filesystem(url, storage_options)
    except ImportError as err:
        raise missing_storage_backend(url, err) from err
    except (ValueError, TypeError) as err:
        raise StorageError(
            f"Cannot use {url!r} ({type(err).__name__}: {err}). Pass a local path or a URL "
            "of a known fsspec protocol (s3://, gs://, memory://...) with fitting storage "
            "options."
        ) from err


def is_local_fs(fs: Any) -> bool:
    """Whether an fsspec file system is the local disk."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


class RunFolder:
    """The parts folder of one render run, ``{out}/.parts-{id}``, held while the run lives.

    Use :meth:`create` (it also checks that ``out`` can be written), then the folder as a
    context manager: leaving it removes the folder, also on errors and Ctrl-C.

    Attributes:
        out: The output folder (path or URL).
        id: The run's id, 12 hex digits.
        url: The parts folder, ``{out}/.parts-{id}``.
        local: The parts folder as a local path, or None on an object store.
    """

    def __init__(self, out: str, storage_options: Mapping[str, Any], run_id: str) -> None:
        self.out = out
        self.id = run_id
        self.url = f"{out}/{PARTS_PREFIX}{run_id}"
        self._options = dict(storage_options)
        self._fs, self._path = filesystem(self.url, self._options)
        self.local: Path | None = Path(self._path) if is_local_fs(self._fs) else None
        self._fd: int | None = None
        self._made_out: Path | None = None  # the output folder, if this run made it
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @classmethod
    def create(cls, out: str, storage_options: Mapping[str, Any] | None = None) -> RunFolder:
        """Check ``out``, remove dead runs' parts folders in it, and make this run's.

        Nothing is rendered before this succeeds, so a bad output location fails first.

        Args:
            out: The output folder: an absolute local path or an fsspec URL.
            storage_options: fsspec options for ``out``.

        Raises:
            StorageError: ``out`` is a file, or cannot be created or written (a missing
                bucket, a read-only file system, a file in the way...).
            StorageBackendMissingError: the URL's protocol needs a missing package.
        """
        run = cls(out, storage_options or {}, uuid.uuid4().hex[:12])
        fs, out_path = filesystem(out, run._options)
        try:
            is_file = fs.isfile(out_path)
        except Exception as err:
            raise run._cannot_write(err) from err
        if is_file:
            raise StorageError(
                f"The output folder {out!r} is a file. Pass a folder (it is created if "
                "missing), or move the file away."
            )
        try:
            run._sweep(fs, out_path)
            run._open()
        except Exception as err:
            run.close()
            raise run._cannot_write(err) from err
        return run

    def _cannot_write(self, err: BaseException) -> StorageError:
        hint = "Check that the folder can be created there, is not a file, and that you may write to it."
        if self.local is None:
            bucket = self._path.split("/", 1)[0]
            hint = (f"Check that the bucket (or container) {bucket!r} exists (create it first) "
                    "and that your credentials may write to it.")
        return StorageError(
            f"Cannot write to the output folder {self.out!r} ({type(err).__name__}: "
            f"{str(err) or 'no message'}). {hint} Nothing was rendered."
        )

    def _sweep(self, fs: Any, out_path: str) -> None:
        if self.local is not None:
            sweep_local(out_path, PARTS_PREFIX)
            return
        for path in fs.glob(f"{out_path}/{PARTS_PREFIX}*"):
            if _remote_is_dead(fs, path):
                fs.rm(path, recursive=True)

    def _open(self) -> None:
        info = json.dumps(_owner())
        if self.local is not None:
            if not self.local.parent.exists():
                self._made_out = self.local.parent
            self.local.mkdir(parents=True)
            (self.local / INFO_NAME).write_text(info)
            self._fd = _hold_lock(self.local)
            return
        self._fs.pipe_file(f"{self._path}/{INFO_NAME}", info.encode())
        self._beat = threading.Thread(target=self._heartbeat, name="flyarchive-heartbeat",
                                      daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            owner = _owner()
            try:
                self._fs.pipe_file(f"{self._path}/{INFO_NAME}", json.dumps(owner).encode())
            except Exception:  # a missed beat is retried; STALE_S allows many
                continue

    @staticmethod
    def is_open(url: str, storage_options: Mapping[str, Any]) -> bool:
        """Whether the run of the parts folder ``url`` still holds it (for workers: a
        segment of a run that was given up is not written)."""
        fs, path = filesystem(url, storage_options)
        return bool(fs.exists(f"{path}/{INFO_NAME}"))

    @classmethod
    def check_open(cls, url: str, storage_options: Mapping[str, Any]) -> None:
        """Raise :meth:`given_up` unless the run of the parts folder ``url`` still holds it."""
        if not cls.is_open(url, storage_options):
            raise cls.given_up(url)

    @staticmethod
    def given_up(url: str) -> RenderFailedError:
        """The error of a task whose run was given up (Ctrl-C, an error elsewhere, a dead
        client): nobody waits for it, and it writes nothing."""
        return RenderFailedError(
            f"The render run of {url!r} was given up (its parts folder is gone); this segment "
            "is not kept."
        )

    @staticmethod
    def staging(url: str, storage_options: Mapping[str, Any]) -> str | None:
        """The local path of the parts folder ``url``, where final outputs are staged; None
        off local disk."""
        fs, path = filesystem(url, storage_options)
        return path if is_local_fs(fs) else None

    def close(self) -> None:
        """Remove the folder and everything in it, then release it; also the output folder
        if this run made it and it is empty (the run failed). Idempotent."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        try:
            if self.local is not None:
                shutil.rmtree(self.local, ignore_errors=True)
            elif self._fs.exists(self._path):
                self._fs.rm(self._path, recursive=True)
        except FileNotFoundError:
            pass
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        if self._made_out is not None:
            with contextlib.suppress(OSError):  # not empty: videos, or another run's parts
                self._made_out.rmdir()
            self._made_out = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _remote_is_dead(fs: Any, path: str) -> bool:
    """Whether the run of a parts folder on an object store is dead (see the module doc)."""
    now = time.time()
    try:
        owner = json.loads(fs.cat_file(f"{path}/{INFO_NAME}"))
    except FileNotFoundError:
        owner = None
    except (OSError, ValueError):
        return False
    if isinstance(owner, dict):
        if owner.get("host") == _host() and not _pid_alive(owner.get("pid")):
            return True
        beat = owner.get("heartbeat")
        return isinstance(beat, (int, float)) and now - beat > STALE_S
    try:  # no marker: dead once everything in it is old
        modified = [fs.modified(p).timestamp() for p in fs.find(path)]
    except Exception:
        return False
    return all(now - m > STALE_S for m in modified)


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True  # cannot tell: keep it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def stage(source: Path, staging: Path, move: bool) -> None:
    """Put a file or folder at ``staging``: renamed there when ``move`` and both are on
    one file system (nothing is copied), else copied."""
    if move:
        try:
            os.rename(source, staging)
            return
        except OSError:  # another file system (EXDEV): copy
            pass
    if source.is_dir():
        shutil.copytree(source, staging)
    else:
        shutil.copyfile(source, staging)
