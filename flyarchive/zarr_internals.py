"""The only module that touches zarr's internals: names under ``zarr.core`` and private names
(``_``-prefixed) of zarr's objects. Everything else in flyarchive uses zarr's public API and
what this module exports, so that a zarr release that moves an internal breaks one module
(``tests/test_zarr_internals.py`` holds the rule).

What flyarchive needs from inside zarr, and why:

- buffers, metadata classes and :func:`sync` (zarr's event loop): the store writes metadata
  documents itself (one round of concurrent requests, :mod:`flyarchive.store.nodes`) and
  reads byte ranges of files (:mod:`flyarchive.store.shards`);
- the sharding codec's layout of a shard and its index (:func:`shard_layout`,
  :func:`decode_shard_index`): the hand shard reader fetches a whole shard in one request
  and decodes each inner chunk into its place (``scripts/bench_query.py`` compares it with
  zarr's own sharded read);
- synchronous decoding of one chunk by one codec (:func:`decode_sync`) and the hooks the
  bounded decoders override (:class:`DecodeHook`), and the write hook of the guarded local
  store (:class:`StoreHooks`);
- an array's asynchronous face (:func:`array_getitem`, :func:`array_config`): several arrays
  read in one round of concurrent requests;
- whether zarr's fused codec pipeline exists (:data:`FUSED_PIPELINE`,
  :data:`HAS_FUSED_PIPELINE`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

# Re-exported for the store (F401: imported here to be imported from here).
from zarr.abc.store import RangeByteRequest, _store_supports_sync_io  # noqa: F401
from zarr.core.array_spec import ArraySpec  # noqa: F401
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype  # noqa: F401
from zarr.core.group import ConsolidatedMetadata, GroupMetadata  # noqa: F401
from zarr.core.metadata import ArrayV3Metadata  # noqa: F401
from zarr.core.metadata.io import save_metadata  # noqa: F401
from zarr.core.sync import sync  # noqa: F401

#: zarr's synchronous codec pipeline: decodes the inner chunks of a shard in one call
#: instead of one coroutine and one thread hop each (2-4x faster reads, measured).
FUSED_PIPELINE = "zarr.core.codec_pipeline.FusedCodecPipeline"


def _has_fused() -> bool:
    try:
        from zarr.core.codec_pipeline import FusedCodecPipeline  # noqa: F401
    except ImportError:
        return False
    return True


#: Whether this zarr has :data:`FUSED_PIPELINE` (zarr 3.4 keeps it opt-in).
HAS_FUSED_PIPELINE = _has_fused()


def store_supports_sync_io(store: Any) -> bool:
    """Whether ``store`` (a zarr store) reads synchronously (``get_sync``)."""
    return bool(_store_supports_sync_io(store))


def array_getitem(arr: Any, selection: Any) -> Awaitable[Any]:
    """``arr[selection]`` as a coroutine (``arr``: a ``zarr.Array``): several arrays read in
    one round of concurrent requests."""
    return arr._async_array.getitem(selection)


def array_config(arr: Any) -> Any:
    """The runtime configuration (``ArrayConfig``) of ``arr`` (a ``zarr.Array``)."""
    return arr._async_array.config


@dataclass(frozen=True)
class ShardLayout:
    """How a sharding codec lays out one shard.

    Attributes:
        per_shard: Inner chunks per shard, per dimension.
        chunk_spec: The ``ArraySpec`` of one inner chunk.
        transform: Decodes one inner chunk (``decode_chunk(buffer, chunk_spec)``).
        index_size: Bytes of the shard's index.
        index_range: The index's byte range in the shard (a ``ByteRequest``).
    """

    per_shard: tuple[int, ...]
    chunk_spec: Any
    transform: Any
    index_size: int
    index_range: Any


def shard_layout(codec: Any, shard_spec: Any) -> ShardLayout:
    """The layout of a shard of ``shard_spec`` (an :class:`ArraySpec`) under ``codec`` (a
    ``ShardingCodec``)."""
    per_shard = codec._get_chunks_per_shard(shard_spec)
    return ShardLayout(per_shard, codec._get_chunk_spec(shard_spec),
                       codec._get_inner_chunk_transform(shard_spec),
                       codec._shard_index_size(per_shard),
                       codec._shard_index_byte_range(per_shard))


def shard_layout_supported(codec: Any) -> bool:
    """Whether this zarr's sharding ``codec`` has what :func:`shard_layout` and
    :func:`decode_shard_index` use, and decodes synchronously."""
    return all(hasattr(codec, name) for name in (
        "_get_inner_chunk_transform", "_decode_shard_index_sync", "_shard_index_byte_range",
        "_get_chunks_per_shard", "_get_chunk_spec", "_shard_index_size")) and bool(
        getattr(codec, "_sync_capable", True))


def decode_shard_index(codec: Any, raw: Buffer, per_shard: tuple[int, ...]) -> Any:
    """The index of a shard from its bytes ``raw`` (its CRC-32C checked)."""
    return codec._decode_shard_index_sync(raw, per_shard)


def decode_sync(codec: Any, data: Any, spec: Any) -> Any:
    """One chunk's bytes decoded by one bytes-to-bytes codec, synchronously."""
    return codec._decode_sync(data, spec)


class DecodeHook:
    """A mixin for a zarr codec (listed before it in the bases) whose synchronous decode
    flyarchive replaces: it defines :meth:`decode_checked`, and calls
    :meth:`decode_unchecked` for zarr's own decode."""

    def _decode_sync(self, chunk_data: Any, chunk_spec: Any) -> Any:
        return self.decode_checked(chunk_data, chunk_spec)

    def decode_checked(self, chunk_data: Any, chunk_spec: Any) -> Any:
        """Decode one chunk (the subclass's own way)."""
        raise NotImplementedError

    def decode_unchecked(self, chunk_data: Any, chunk_spec: Any) -> Any:
        """zarr's own decode of one chunk."""
        return super()._decode_sync(chunk_data, chunk_spec)  # type: ignore[misc]


class StoreHooks:
    """A mixin for a zarr store (listed before it in the bases) whose writes flyarchive
    checks: it defines :meth:`set_checked`, and calls :meth:`set_unchecked` for zarr's own
    write; :meth:`ready` and :meth:`ready_sync` open the store on first use."""

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        await self.set_checked(key, value, exclusive)

    async def set_checked(self, key: str, value: Buffer, exclusive: bool) -> None:
        """Write ``value`` at ``key`` (the subclass's own way)."""
        raise NotImplementedError

    async def set_unchecked(self, key: str, value: Buffer, exclusive: bool) -> None:
        """zarr's own write."""
        await super()._set(key, value, exclusive=exclusive)  # type: ignore[misc]

    async def ready(self) -> None:
        """The store opened (zarr opens a store on its first use)."""
        await self._ensure_open()  # type: ignore[attr-defined]

    def ready_sync(self) -> None:
        """As :meth:`ready`, from synchronous code."""
        self._ensure_open_sync()  # type: ignore[attr-defined]

