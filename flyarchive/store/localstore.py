"""A local zarr store that reads and writes only regular files inside its archive.

zarr's ``LocalStore`` opens whatever a path names: a symlink to ``/dev/zero`` (reads
never end), a FIFO (the open blocks forever), a 6 GB file where a 100-byte chunk
belongs, a folder symlinked out of the archive (writes land outside it).
:class:`GuardedLocalStore` resolves every key and refuses one that leads out of the
archive root, ``lstat``s before opening and opens with ``O_NOFOLLOW | O_NONBLOCK``,
reads only regular files, bounds each file's size by what its array's declared
shapes can need (:mod:`flyarchive.store.allowlist`), and checks metadata files before
zarr parses them. A writable store refuses, when it is made, an archive holding a
folder symlinked out of it (down to an array's ``c/<world block>`` folders), before
anything is written; every write checks its own path.

Reads take a short way where it gives the same answer (Linux): the key's folder is
opened (``O_DIRECTORY``), the real path of what was opened (``/proc/self/fd``) must lie
inside the archive's real root (kept once, looked up again when it differs), then the
last component is ``lstat``-ed and opened relative to that folder's descriptor
(``dir_fd``, ``O_NOFOLLOW``) and ``fstat``-ed: five system calls where
``os.path.realpath`` ``lstat``s every component in Python. Anything else there (a
folder missing or outside, a link, a FIFO, a device, a folder at the last component)
takes the long way, :meth:`GuardedLocalStore._inside` and :func:`open_regular`, which
says what is wrong as before.

Many chunk reads in a row (a reader's whole selection) may share what they look up, on
the thread that reads them, inside :meth:`GuardedLocalStore.reading_batch`: each array's
chunk folder (``qpos/c``) is opened and checked once, each chunk file is then ``lstat``-ed
and opened relative to it and its own real path checked inside the root (four system
calls where the short way takes nine with the array's bounds looked up again), and the
array's bounds (:meth:`GuardedLocalStore._limit`) are looked up once. A chunk the batch
cannot open that way (missing, a link, anything irregular) takes the ways above, which
say what is there. A batch holds its folders' descriptors only while it lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import stat
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import zarr.storage
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from flyarchive.errors import IrregularFileError, UnsafeFileError
from flyarchive.store import allowlist
from flyarchive.zarr_internals import Buffer, BufferPrototype, StoreHooks, default_buffer_prototype

#: Largest file read that is neither metadata nor an array's chunk (claims, models), bytes.
MAX_OTHER_BYTES = 1 << 30
_METADATA = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")
#: Where the kernel says what a descriptor opened (Linux); None: every read takes the long way.
_FD_LINKS = "/proc/self/fd" if os.path.isdir("/proc/self/fd") and os.open in os.supports_dir_fd \
    and os.stat in os.supports_dir_fd else None
_LONG_WAY = object()  # what the short way returns when it cannot answer
_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket",
          stat.S_IFLNK: "a symbolic link"}


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` is, as a phrase: ``"a FIFO (named pipe)"``..."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_regular(real: str, *, restore: str = "the chunk file"
                 ) -> tuple[int, os.stat_result] | None:
    """A read-only descriptor and the stat of the regular file at ``real``, opened without
    following a link at its last component and without blocking (a FIFO never hangs the
    open); None when nothing (or a folder) is there. The caller closes the descriptor.

    Args:
        real: The path, its links already resolved (``os.path.realpath``) by the caller.
        restore: What the fix restores, for the message.

    Raises:
        IrregularFileError: a FIFO, device, socket or link is there, or became there
            between the check and the open (a regular file put there by a rename is read).
    """
    try:
        st = os.lstat(real)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        raise IrregularFileError(
            f"is {kind_of(st.st_mode)}, not a regular file; flyarchive never opens it "
            "(reading it could block forever or never end)", f"Delete it and restore {restore}.")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise IrregularFileError("became a symbolic link", "Restore the file.") from None
        raise
    opened = os.fstat(fd)
    # A writer may have replaced the file (a rename over it) between the lstat and the open:
    # what was opened is then the new file, which is as good if it is a regular file too.
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise IrregularFileError(
            f"became {kind_of(opened.st_mode)} while it was opened; flyarchive never reads it",
            f"Delete it and restore {restore}.")
    return fd, opened


class _Batch:
    """What the chunk reads of one :meth:`GuardedLocalStore.reading_batch` share: each
    array's chunk folder descriptor (None: it takes the long way) and its bounds."""

    def __init__(self) -> None:
        self.folders: dict[str, int | None] = {}
        self.limits: dict[str, allowlist.ChunkLimits] = {}


class GuardedLocalStore(StoreHooks, zarr.storage.LocalStore):
    """``zarr.storage.LocalStore`` confined to regular files inside ``root``.

    Raises (from its methods):
        UnsafeFileError: a key that resolves outside the root, a file that is not a
            regular file, a file larger than its array can need, a writable archive
            holding a folder symlinked out of it.
        SchemaError: a metadata file too large or deep to parse safely, or naming a codec
            pipeline flyarchive does not write.
    """

    #: What the store holds, for messages ("leads out of the archive").
    _what = "archive"

    def __init__(self, root: Path | str, *, read_only: bool = False) -> None:
        super().__init__(root, read_only=read_only)
        self._limits: dict[str, tuple[tuple[int, int, int], allowlist.ChunkLimits]] = {}
        self._real_root: str | None = None  # the root's real path, as last looked up
        self._batches = threading.local()  # the current thread's reading batch, if any
        if not read_only and self.root.is_dir():
            self._check_links()  # before anything is opened, let alone written

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to a Dask worker) without the reading batches of this process's
        threads."""
        state = dict(self.__dict__)
        state.pop("_batches", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._batches = threading.local()

    # ------------------------------------------------------------------ paths
    def _root_real(self) -> str:
        return os.path.realpath(self.root)

    def _refuse(self, key: str, problem: str, fix: str) -> UnsafeFileError:
        return UnsafeFileError(
            f"{self.root / key} {problem}. {fix} The archive was damaged or tampered with; "
            f"run `flyarchive verify {self.root}` to list every problem."
        )

    def _inside(self, key: str) -> str:
        """The real path of ``key``; refuses one that leads out of the root."""
        root = self._root_real()
        real = os.path.realpath(os.path.join(self.root, key))
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise self._refuse(key, f"leads out of the {self._what} (to {real}); flyarchive "
                               "never reads or writes through it", "Replace the link by the file or "
                               "folder itself.")
        return real

    def _inside_real(self, real: str) -> bool:
        """Whether the real path ``real`` is the root or lies inside it (the root's real
        path looked up again when it does not, in case the root's own links changed)."""
        for fresh in (False, True):
            root = self._real_root
            if fresh or root is None:
                root = self._real_root = self._root_real()
            if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
                return True
        return False

    def _folder_fd(self, key: str) -> tuple[int, str] | None:
        """A descriptor of ``key``'s folder, found inside the root by its real path, and
        the last component; None where the short way cannot tell (the caller closes)."""
        if _FD_LINKS is None:
            return None
        folder, _, name = key.rpartition("/")
        if not name or name in (".", ".."):
            return None
        try:
            dfd = os.open(os.path.join(self.root, folder), os.O_RDONLY | os.O_DIRECTORY
                          | os.O_CLOEXEC)
        except OSError:
            return None  # missing, not a folder...: the long way says what is there
        try:
            if self._inside_real(os.readlink(f"{_FD_LINKS}/{dfd}")):
                return dfd, name
        except OSError:
            pass
        os.close(dfd)
        return None

    def _open_short(self, key: str) -> tuple[int, os.stat_result] | None | object:
        """:meth:`_open_regular` the short way (see the module's docstring); ``_LONG_WAY``
        where it cannot answer."""
        found = self._folder_fd(key)
        if found is None:
            return _LONG_WAY
        dfd, name = found
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
            if not stat.S_ISREG(st.st_mode):
                return _LONG_WAY
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=dfd)
            except OSError:
                return _LONG_WAY  # replaced meanwhile (a link: ELOOP), or gone
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                os.close(fd)
                return _LONG_WAY
            return fd, opened
        finally:
            os.close(dfd)

    def _stat_short(self, key: str) -> os.stat_result | None | object:
        """``os.stat`` of the regular file at ``key`` the short way (None: nothing there;
        ``_LONG_WAY`` where it cannot answer)."""
        found = self._folder_fd(key)
        if found is None:
            return _LONG_WAY
        dfd, name = found
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            return _LONG_WAY
        finally:
            os.close(dfd)
        return st if stat.S_ISREG(st.st_mode) else _LONG_WAY

    def _check_links(self, depth: int = 3) -> None:
        """Refuse a writable archive holding a folder symlinked out of it, down to ``depth``
        levels (``qpos/c/0``; deeper folders are one per block of frames, too many to visit
        on every open, and every write checks its own path anyway)."""
        root = self._root_real()
        level = [root]
        for _ in range(depth):
            below = []
            for folder in level:
                try:
                    entries = os.scandir(folder)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # deleted meanwhile (a writer replacing the archive): no link
                with entries:
                    for entry in entries:
                        if entry.is_symlink():
                            if os.path.isdir(entry.path):
                                self._inside(os.path.relpath(entry.path, root))
                        elif entry.is_dir(follow_symlinks=False):
                            below.append(entry.path)
            level = below

    # ------------------------------------------------------------------ batches
    @contextlib.contextmanager
    def reading_batch(self) -> Iterator[None]:
        """Chunk reads on this thread, until the block ends, share each array's chunk
        folder and bounds (see the module's docstring). Nested batches are one."""
        if getattr(self._batches, "now", None) is not None or _FD_LINKS is None:
            yield
            return
        batch = self._batches.now = _Batch()
        try:
            yield
        finally:
            self._batches.now = None
            for fd in batch.folders.values():
                if fd is not None:
                    os.close(fd)

    def _open_batched(self, batch: _Batch, key: str
                      ) -> tuple[int, os.stat_result] | object:
        """The regular file at chunk ``key`` opened relative to its array's chunk folder
        (kept by ``batch``), its real path inside the root; ``_LONG_WAY`` for anything
        else (the other ways say what is there)."""
        array, sep, rest = key.partition("/c/")
        if not sep or not rest:
            return _LONG_WAY
        if array not in batch.folders:
            found = self._folder_fd(f"{array}/c/x")
            batch.folders[array] = found[0] if found is not None else None
        dfd = batch.folders[array]
        if dfd is None:
            return _LONG_WAY
        try:
            st = os.stat(rest, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return _LONG_WAY
            fd = os.open(rest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except OSError:
            return _LONG_WAY
        try:
            opened = os.fstat(fd)
            if stat.S_ISREG(opened.st_mode) and self._inside_real(
                    os.readlink(f"{_FD_LINKS}/{fd}")):
                return fd, opened
        except OSError:
            pass
        os.close(fd)
        return _LONG_WAY

    def _batch_limit(self, batch: _Batch | None, key: str) -> allowlist.ChunkLimits:
        if batch is None:
            return self._limit(key)
        array = key.partition("/c/")[0]
        limit = batch.limits.get(array)
        if limit is None:
            limit = batch.limits[array] = self._limit(key)
        return limit

    # ------------------------------------------------------------------ reading
    def _limit(self, key: str) -> allowlist.ChunkLimits:
        name = key.rsplit("/", 1)[-1]
        if name in _METADATA:
            return allowlist.ChunkLimits(allowlist.MAX_METADATA_BYTES)
        array, sep, _ = key.partition("/c/")
        if not sep:
            return allowlist.ChunkLimits(MAX_OTHER_BYTES)
        meta_key = f"{array}/zarr.json"
        st = self._stat_short(meta_key)
        if st is _LONG_WAY:
            try:
                st = os.stat(self._inside(meta_key))
            except FileNotFoundError:
                st = None
        if st is None:
            return allowlist.ChunkLimits(MAX_OTHER_BYTES)  # zarr reads no chunk without metadata
        assert isinstance(st, os.stat_result)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._limits.get(array)
        if cached is None or cached[0] != stamp:
            raw = self._read(meta_key, None)
            meta = json.loads(raw) if raw is not None else {}
            if not isinstance(meta, dict) or meta.get("node_type") != "array":
                return allowlist.ChunkLimits(MAX_OTHER_BYTES)
            cached = (stamp, allowlist.check_array_metadata(meta, str(self.root / meta_key),
                                                            str(self.root)))
            self._limits[array] = cached
        return cached[1]

    def _open_regular(self, key: str) -> tuple[int, os.stat_result] | None:
        """A descriptor and stat of the regular file at ``key``; None if there is none."""
        found = self._open_short(key)
        if found is not _LONG_WAY:
            return found  # type: ignore[return-value]
        try:
            return open_regular(self._inside(key))
        except IrregularFileError as err:
            raise self._refuse(key, err.problem, err.fix) from None

    def _read(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        batch = getattr(self._batches, "now", None)
        found: Any = _LONG_WAY
        if batch is not None and byte_range is not None:
            found = self._open_batched(batch, key)
        if found is _LONG_WAY:
            found = self._open_regular(key)
        if found is None:
            return None
        fd, st = found
        with io.FileIO(fd, "rb", closefd=True) as f:
            limit = self._batch_limit(batch, key)
            if st.st_size > limit.file_bytes:
                raise self._refuse(
                    key, f"is {st.st_size} bytes, more than the {limit.file_bytes} bytes its "
                    "array's declared shapes can need; flyarchive did not read it",
                    "Restore the file.")
            size = st.st_size
            if byte_range is None:
                start, stop = 0, size
            elif isinstance(byte_range, RangeByteRequest):
                start, stop = byte_range.start, min(byte_range.end, size)
            elif isinstance(byte_range, OffsetByteRequest):
                start, stop = byte_range.offset, size
            elif isinstance(byte_range, SuffixByteRequest):
                start, stop = max(0, size - byte_range.suffix), size
            else:
                raise TypeError(f"Unexpected byte_range, got {byte_range}.")
            f.seek(start)
            data = f.read(max(0, stop - start))
        name = key.rsplit("/", 1)[-1]
        if name in _METADATA and name != "zarr.json":
            raise allowlist.refuse(str(self.root / key), "it is zarr v2 metadata; flyarchive "
                                   "archives are zarr v3 (their metadata is zarr.json)",
                                   str(self.root))
        if name == "zarr.json" and byte_range is None:
            allowlist.check_json_bytes(data, str(self.root / key), str(self.root))
            self._check_metadata(key, data)
        elif limit.zstd_bytes is not None and byte_range is None:
            self._check_zstd(key, data, limit.zstd_bytes)
        return data

    def _check_metadata(self, key: str, data: bytes) -> None:
        try:
            meta = json.loads(data)
        except ValueError:
            return  # zarr reports unparsable metadata itself
        if isinstance(meta, dict) and meta.get("node_type") == "array":
            allowlist.check_array_metadata(meta, str(self.root / key), str(self.root))

    def _check_zstd(self, key: str, data: bytes, most: int) -> None:
        try:
            size = allowlist.zstd_content_size(data)
        except ValueError as err:
            raise self._refuse(key, f"is not zstd data ({err})", "Restore the file.") from None
        if size is None:
            raise self._refuse(key, "is zstd data that does not declare its decoded size, "
                               "which flyarchive needs to bound memory", "Restore the file.")
        if size > most:
            raise self._refuse(key, f"is zstd data that declares {size} decoded bytes, more "
                               f"than the {most} a label chunk may hold; flyarchive did not "
                               "decode it", "Restore the file.")

    def _buffer(self, key: str, prototype: BufferPrototype | None,
                byte_range: ByteRequest | None) -> Buffer | None:
        data = self._read(key, byte_range)
        if data is None:
            return None
        return (prototype or default_buffer_prototype()).buffer.from_bytes(data)

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:
        self.ready_sync()
        return self._buffer(key, prototype, byte_range)

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        await self.ready()
        return await asyncio.to_thread(self._buffer, key, prototype, byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def get_ranges(self, key: str, byte_ranges: Sequence[ByteRequest | None],
                         **kwargs: Any) -> AsyncIterator[Sequence[tuple[int, Buffer | None]]]:
        # Checked here first: a refusal inside zarr's coalescer would arrive wrapped in
        # an exception group.
        await asyncio.to_thread(self._precheck, key)
        async for group in super().get_ranges(key, byte_ranges, **kwargs):
            yield group

    def get_ranges_sync(self, key: str, byte_ranges: Sequence[ByteRequest | None],
                        **kwargs: Any) -> Sequence[tuple[int, Buffer | None]]:
        self._precheck(key)
        return super().get_ranges_sync(key, byte_ranges, **kwargs)

    def _precheck(self, key: str) -> None:
        found = self._open_regular(key)
        if found is not None:
            os.close(found[0])
            if found[1].st_size > self._limit(key).file_bytes:
                self._read(key, None)  # raises the size refusal

    async def exists(self, key: str) -> bool:
        def regular() -> bool:
            st = self._stat_short(key)
            if st is not _LONG_WAY:
                return st is not None
            real = self._inside(key)
            try:
                return stat.S_ISREG(os.lstat(real).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                return False

        return await asyncio.to_thread(regular)

    async def getsize(self, key: str) -> int:
        self._inside(key)
        return await super().getsize(key)

    # ------------------------------------------------------------------ listing
    def _files(self, prefix: str) -> list[str]:
        root = self._root_real()
        base = self._inside(prefix) if prefix else root
        out = []
        for folder, _, files in os.walk(base):  # never descends into symlinked folders
            for name in files:
                path = os.path.join(folder, name)
                key = os.path.relpath(path, root).replace(os.sep, "/")
                if os.path.islink(path):
                    real = os.path.realpath(path)
                    if not real.startswith(root + os.sep) or not os.path.isfile(real):
                        continue
                out.append(key)
        return out

    async def list(self) -> AsyncIterator[str]:
        for key in await asyncio.to_thread(self._files, ""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await asyncio.to_thread(self._files, prefix.rstrip("/")):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        if prefix:
            await asyncio.to_thread(self._inside, prefix.rstrip("/"))
        async for name in super().list_dir(prefix):
            yield name

    # ------------------------------------------------------------------ writing
    def set_sync(self, key: str, value: Buffer) -> None:
        self.ready_sync()
        self._inside(key)
        super().set_sync(key, value)

    async def set_checked(self, key: str, value: Buffer, exclusive: bool) -> None:
        await self.ready()
        if not exclusive:  # the check and the write in one trip to a thread
            await asyncio.to_thread(self.set_sync, key, value)
            return
        await asyncio.to_thread(self._inside, key)
        await self.set_unchecked(key, value, exclusive)

    def delete_sync(self, key: str) -> None:
        self._inside(key)
        super().delete_sync(key)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._inside, key)
        await super().delete(key)

    async def delete_dir(self, prefix: str) -> None:
        if prefix:
            await asyncio.to_thread(self._inside, prefix.rstrip("/"))
        await super().delete_dir(prefix)
