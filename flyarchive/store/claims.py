"""Writer claims: which process may write an archive, or a block of its worlds.

A writer holds one claim from the moment it creates or opens an archive until it
is closed (or garbage-collected):

- ``claims/writer.json``: the whole archive (a recorder without ``world_block``,
  and every creator: the claim is taken *before* anything else is written, so of
  two processes creating one URL at once exactly one goes on);
- ``claims/shard-NNNNNN.json``: one per shard of worlds of a ``world_block``
  writer, so that several processes write disjoint blocks of one archive (zarr
  cannot merge partial shard writes).

The whole-archive claim and block claims exclude each other: each writer puts its
own claim first, then looks for the other kind, and backs off if it finds one.

A claim is created exclusively. Local disk: a hard link, which fails if the name
exists (atomic). Object stores: a conditional put (``If-None-Match: *``, which S3
and moto's server honour) where fsspec offers one (``pipe_file(mode="create")``),
else a check, a put and a read-back, which catches all but near-simultaneous
claims. Every put is read back: the claim is ours only if it holds our writer id.

A claim records its holder (host, process id and start time, since when). A claim
whose holder is provably dead is taken over without asking: same host, same boot
and same pid namespace, and the process is gone (or is another process now); or,
in this process, its writer was closed, failed a commit, or no longer exists. Any
other claim is taken over only with ``takeover=True``, and never one whose holder is
seen running (same host, boot and pid namespace, the process still there): a takeover
is for a writer that crashed, or runs where this host cannot see it.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flyarchive.zarr_internals import default_buffer_prototype

from flyarchive.errors import ArchiveInUseError, OptionsError, SchemaError, WorldBlockConflictError

PREFIX = "claims"
#: The whole-archive writer claim.
WRITER_KEY = f"{PREFIX}/writer.json"


#: This process's writers by writer id: a claim of this process is alive only while its
#: writer exists and is neither closed nor failed (a failed commit ends a writer).
_HOLDERS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
#: Writer ids of claims this process made that no writer holds yet (being created) and
#: that were not released: alive, as another process sees them (a thread of this process
#: creating the same archive took them while their creator was still setting up).
_CLAIMING: set[str] = set()


def register(writer: str, holder: Any) -> None:
    """Record that ``holder`` (with ``abandoned`` and ``taken_over()``) holds claim ``writer``."""
    _HOLDERS[writer] = holder
    _CLAIMING.discard(writer)


def _sync(coro: Any) -> Any:
    from flyarchive.zarr_internals import sync

    return sync(coro)


# ----------------------------------------------------------------------------- identity
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id").strip()


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a Linux process; None if none."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[0], int(fields[19])


def _identity() -> dict[str, Any]:
    stat = _proc_stat(os.getpid())
    return {"host": socket.gethostname(), "pid": os.getpid(), "boot": _boot_id(),
            "pidns": _pid_namespace(), "started": stat[1] if stat else None}


def _can_see_process(record: dict[str, Any]) -> bool:
    """True if ``record``'s pid can be checked here (same host, boot and pid namespace)."""
    me = _identity()
    return (record.get("host") == me["host"] and record.get("boot") == me["boot"]
            and record.get("pidns") == me["pidns"] and isinstance(record.get("pid"), int))


@dataclass(frozen=True)
class Claim:
    """What a claim file says.

    Attributes:
        key: The claim's key in the store.
        record: Its JSON content: ``writer`` (a unique id), ``kind`` (``"archive"`` or
            ``"block"``), ``start``/``stop`` (blocks), ``host``, ``pid``, ``time`` (Unix
            seconds).
    """

    key: str
    record: dict[str, Any]

    @property
    def writer(self) -> str:
        return str(self.record.get("writer"))

    def alive(self) -> bool | None:
        """True if the holder runs, False if it provably does not, None if unknown
        (another host, another pid namespace, or a claim without a process id)."""
        rec = self.record
        if not _can_see_process(rec):  # host names can repeat: a pid is checked only here
            return None
        pid = int(rec["pid"])
        if pid == os.getpid() and rec.get("started") == _identity()["started"]:
            if self.writer in _CLAIMING:
                return True
            holder = _HOLDERS.get(self.writer)
            return holder is not None and not holder.abandoned
        stat = _proc_stat(pid)
        if stat is None and os.path.isdir("/proc/self"):
            return False
        if stat is not None:
            state, started = stat
            return state not in ("Z", "X") and rec.get("started") in (None, started)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def describe(self) -> str:
        """``process 1234 on host 'x' (still running) since 2026-01-02 03:04:05 UTC``."""
        rec = self.record
        if "pid" not in rec:
            who = "a writer (no process recorded)"
        else:
            host = "this host" if rec.get("host") == socket.gethostname() else f"host {rec.get('host')!r}"
            state = {True: " (still running)", False: " (no longer running)", None: ""}[self.alive()]
            who = f"process {rec['pid']} on {host}{state}"
            if rec.get("pid") == os.getpid() and self.alive():
                who = f"this process ({rec['pid']}: another writer, not closed yet)"
        since = rec.get("time")
        if isinstance(since, (int, float)):
            who += " since " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
        return who


def _record(kind: str, **extra: Any) -> dict[str, Any]:
    """A new claim of this process, alive from now (:data:`_CLAIMING`) until its writer is
    registered or it is released."""
    writer = uuid.uuid4().hex
    _CLAIMING.add(writer)
    return {"writer": writer, "kind": kind, **extra, **_identity(), "time": time.time()}


# ----------------------------------------------------------------------------- store access
def put_exclusive(store: Any, key: str, data: bytes) -> bool:
    """Create ``key`` holding ``data`` unless it exists; True if this call created it.

    ``data`` must be unique to the caller (it is compared on read-back). Local disk:
    atomic (hard link). fsspec stores: a conditional put where the filesystem
    supports ``pipe_file(mode="create")`` (S3: ``If-None-Match``), else check-then-put.
    """
    proto = default_buffer_prototype()
    from zarr.storage import FsspecStore

    if isinstance(store, FsspecStore):
        root = store.path.rstrip("/")
        path = f"{root}/{key}" if root else key
        try:
            _sync(store.fs._pipe_file(path, data, mode="create"))
        except FileExistsError:
            pass  # another writer's, or our own put whose answer was lost and retried
        except (TypeError, NotImplementedError):
            _sync(store.set_if_not_exists(key, proto.buffer.from_bytes(data)))
    else:
        try:
            _sync(store.set_if_not_exists(key, proto.buffer.from_bytes(data)))
        except FileNotFoundError:  # local: a refused creator removed the empty folder meanwhile
            _sync(store.set_if_not_exists(key, proto.buffer.from_bytes(data)))
    got = _sync(store.get(key, prototype=proto))
    return got is not None and got.to_bytes() == data


def _put(store: Any, key: str, data: bytes) -> bool:
    """Overwrite ``key`` (a takeover); True if it holds ``data`` when read back."""
    proto = default_buffer_prototype()
    _sync(store.set(key, proto.buffer.from_bytes(data)))
    got = _sync(store.get(key, prototype=proto))
    return got is not None and got.to_bytes() == data


def read_claim(store: Any, key: str, url: str = "") -> Claim | None:
    """The claim at ``key``, or None if there is none.

    Raises:
        SchemaError: if the file is not a claim (damaged or edited).
    """
    got = _sync(store.get(key, prototype=default_buffer_prototype()))
    if got is None:
        return None
    try:
        record = json.loads(got.to_bytes())
        if not isinstance(record, dict) or not isinstance(record.get("writer"), str):
            raise ValueError("not a JSON object with a 'writer' string")
        if key != WRITER_KEY and not (isinstance(record.get("start"), int)
                                      and isinstance(record.get("stop"), int)):
            raise ValueError("no integer 'start' and 'stop'")
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise SchemaError(
            f"The writer claim {key!r} of the archive at {url!r} is damaged ({type(err).__name__}: "
            f"{str(err)[:200]}). If no process is writing this archive, delete that file "
            "(or pass takeover=True, --takeover on the command line); then run `flyarchive "
            "verify` on the archive."
        ) from None
    return Claim(key, record)


def _shard_claims(store: Any, url: str, *, takeover: bool) -> list[Claim]:
    async def keys() -> list[str]:
        return [f"{PREFIX}/{name}" async for name in store.list_dir(PREFIX)
                if name.startswith("shard-") and name.endswith(".json")]

    out = []
    for key in sorted(_sync(keys())):
        try:
            claim = read_claim(store, key, url)
        except SchemaError:
            if not takeover:
                raise
            claim = Claim(key, {"writer": "damaged"})
        if claim is not None:
            out.append(claim)
    return out


def live_claims(store: Any, url: str = "") -> list[Claim]:
    """The claims of ``store`` whose holder may be writing: running, or not provably dead
    (on another host...). Damaged claim files are left out (writers refuse them).

    Raises:
        OSError (and the storage's client errors): the storage failed.
    """
    found = []
    try:
        whole = read_claim(store, WRITER_KEY, url)
    except SchemaError:
        whole = None
    for claim in ([whole] if whole is not None else []) + _shard_claims(store, url, takeover=True):
        if claim.writer != "damaged" and claim.alive() is not False:
            found.append(claim)
    return found


def release(store: Any, keys: list[str], writer: str) -> None:
    """Delete the claims at ``keys`` that still name ``writer`` (never another's)."""
    _CLAIMING.discard(writer)
    for key in keys:
        try:
            claim = read_claim(store, key)
        except SchemaError:
            continue
        if claim is not None and claim.writer == writer:
            _sync(store.delete(key))


# ----------------------------------------------------------------------------- whole archive
def claim_archive(store: Any, url: str, *, takeover: bool = False) -> str:
    """Claim the whole archive at ``url`` for this writer; returns the writer id.

    Args:
        store: The archive's zarr store (its location may still be empty).
        url: For messages.
        takeover: Take over the claim of a writer that crashed (on another host, or one
            whose death cannot be proven from here), and its block claims; never one
            seen running on this host.

    Raises:
        ArchiveInUseError: another writer holds the archive or a block of it; the
            error's ``holder`` attribute describes it.
        SchemaError: a claim file is damaged (and ``takeover`` is False).
    """
    record = _record("archive")
    other = _acquire(store, WRITER_KEY, json.dumps(record).encode(), url,
                     lambda claim: _may_take(claim, takeover))
    if other is not None:
        raise _in_use(url, other, takeover=takeover)
    blocks = _shard_claims(store, url, takeover=takeover)
    live = [c for c in blocks if not _may_take(c, takeover)]
    if live:
        release(store, [WRITER_KEY], record["writer"])
        raise _in_use(url, live[0], blocks=len(live), takeover=takeover)
    for claim in blocks:  # crashed block writers', taken over
        _sync(store.delete(claim.key))
    return record["writer"]


def _may_take(claim: Claim, takeover: bool) -> bool:
    """Whether a writer may overwrite ``claim``: its holder is provably dead; or, asked
    to take over, its holder is not provably running (a writer seen running in another
    process of this host is never taken over: two writers would interleave their commits;
    one of this process is, and stops: :meth:`ArchiveWriter.taken_over`)."""
    alive = claim.alive()
    return alive is False or (takeover and (alive is not True or claim.writer in _HOLDERS))


def _acquire(store: Any, key: str, data: bytes, url: str,
             may_take: Callable[[Claim], bool]) -> Claim | None:
    """Put the claim ``data`` at ``key``; None if it is ours, else the claim that holds it.

    An existing claim is overwritten only if ``may_take`` says so (a takeover); a
    damaged one counts as ``Claim(key, {"writer": "damaged"})``.
    """
    other: Claim | None = None
    for _ in range(2):  # a claim released between our put and our read: try once more
        if put_exclusive(store, key, data):
            return None
        try:
            other = read_claim(store, key, url)
        except SchemaError:
            other = Claim(key, {"writer": "damaged"})
            if not may_take(other):
                raise
        if other is None:
            continue
        if not may_take(other):
            return other
        if _put(store, key, data):
            holder = _HOLDERS.pop(other.writer, None)
            if holder is not None:  # a failed or closed writer of this process: it stops here
                holder.taken_over()
            return None
        return read_claim(store, key, url) or other
    return other or Claim(key, {"writer": "unknown"})


def _in_use(url: str, holder: Claim | None, *, blocks: int = 0,
            takeover: bool = False) -> ArchiveInUseError:
    who = holder.describe() if holder is not None else "another writer"
    if takeover and holder is not None and not _may_take(holder, takeover):
        pid = holder.record.get("pid")
        err = ArchiveInUseError(
            f"Another writer is writing the archive at {url!r}: it is held by {who}. A takeover "
            "takes over only the claim of a writer that crashed (or runs where this host cannot "
            f"see it); this one is running, and two writers would interleave their commits. "
            f"Wait until it is closed, or stop it first (kill {pid}), then take its claim over.")
        err.holder = who  # type: ignore[attr-defined]
        return err
    if blocks:
        rec = holder.record if holder is not None else {}
        what = (f"{blocks} block(s) of its worlds are claimed by world_block writers "
                f"(e.g. [{rec.get('start')}, {rec.get('stop')}) by {who})")
    else:
        what = f"it is held by {who}"
    err = ArchiveInUseError(
        f"Another writer is writing the archive at {url!r}: {what}. Two writers of one archive "
        "would write the same frames. Wait until it is closed; if it crashed, pass "
        "takeover=True (--takeover on the command line) to take its claim over."
    )
    err.holder = who  # type: ignore[attr-defined]
    return err


# ----------------------------------------------------------------------------- world blocks
def shards_of_block(start: int, stop: int, shard_worlds: int, n_worlds: int) -> range:
    """The shard indices a block of world indices ``[start, stop)`` covers.

    Raises:
        OptionsError: if the block is empty, outside the archive, or not shard-aligned.
    """
    if not 0 <= start < stop <= n_worlds:
        raise OptionsError(
            f"World block [{start}, {stop}) is not inside the archive's {n_worlds} worlds."
        )
    if start % shard_worlds or (stop % shard_worlds and stop != n_worlds):
        raise OptionsError(
            f"World block [{start}, {stop}) does not follow shard boundaries (every "
            f"{shard_worlds} worlds): two writers would share a shard and lose data. "
            f"Start and end blocks at multiples of {shard_worlds}."
        )
    return range(start // shard_worlds, -(-stop // shard_worlds))


def _key(shard: int) -> str:
    return f"{PREFIX}/shard-{shard:06d}.json"


def block_keys(start: int, stop: int, shard_worlds: int, n_worlds: int) -> list[str]:
    """The claim keys of a block of world indices."""
    return [_key(s) for s in shards_of_block(start, stop, shard_worlds, n_worlds)]


def claim_block(store: Any, start: int, stop: int, shard_worlds: int, n_worlds: int,
                *, takeover: bool = False, url: str = "") -> str:
    """Claim world indices ``[start, stop)`` for one writer; returns the writer id.

    Args:
        store: The archive's zarr store.
        takeover: Take over claims of exactly this block left by an earlier writer
            (to resume after a crash), unless their holder is seen running on this host.
            Claims of other blocks are taken over only when their holder is provably dead.

    Raises:
        WorldBlockConflictError: naming the block that already owns a shard.
        ArchiveInUseError: when a writer holds the whole archive.
        SchemaError: when a claim file is damaged (and ``takeover`` is False).
    """
    record = _record("block", start=start, stop=stop)
    data = json.dumps(record).encode()

    def may_take(claim: Claim) -> bool:
        rec = claim.record
        return _may_take(claim, takeover and (
            rec.get("writer") == "damaged" or (rec.get("start"), rec.get("stop")) == (start, stop)))

    taken: list[str] = []
    for key in block_keys(start, stop, shard_worlds, n_worlds):
        try:
            other = _acquire(store, key, data, url, may_take)
        except SchemaError:
            release(store, taken, record["writer"])
            raise
        if other is not None:
            release(store, taken, record["writer"])
            running = takeover and other.alive() is True
            raise WorldBlockConflictError(
                f"World indices [{start}, {stop}) overlap the block [{other.record.get('start')}, "
                f"{other.record.get('stop')}) that another writer claimed ({other.describe()}). "
                + ("A takeover takes over only the claim of a writer that crashed: wait until "
                   f"it is closed, or stop it first (kill {other.record.get('pid')})."
                   if running else "Give each writer a disjoint block; to resume a crashed "
                   "writer's own block, pass takeover=True.")
            )
        taken.append(key)
    try:
        whole = read_claim(store, WRITER_KEY, url)
    except SchemaError:
        release(store, taken, record["writer"])
        raise
    if whole is not None and whole.alive() is not False:
        release(store, taken, record["writer"])
        raise _in_use(url, whole)
    return record["writer"]
