"""zarr's decoders for what flyarchive writes, made to keep to each chunk's declared shape
and to report damaged bytes as :class:`~flyarchive.errors.CorruptArchiveError`.

pcodec's compression ratio has no bound, and a Blosc header can declare gigabytes in a
few stored bytes: :class:`BoundedPCodec` decodes into the chunk's declared shape and
never past it, :class:`BoundedBloscCodec` refuses an oversized header before anything
is allocated, and :class:`CheckedCrc32cCodec` says what a checksum mismatch means.
:func:`install_bounded_decoders` makes them zarr's decoders in this process (their
metadata is checked first: :mod:`flyarchive.store.allowlist`); :func:`direct_decoder`
decodes one inner chunk straight into its place for the shard reader.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import google_crc32c
import numpy as np
import zarr
from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec
from zarr.codecs.numcodecs import PCodec

from flyarchive.errors import CorruptArchiveError
from flyarchive.zarr_internals import (
    ArraySpec,
    DecodeHook,
    decode_sync,
    default_buffer_prototype,
)


def damaged(reason: str) -> CorruptArchiveError:
    """The error for a chunk whose bytes do not decode; ``reason`` is kept as ``.reason``
    for callers that name the chunk and the archive themselves."""
    err = CorruptArchiveError(
        f"{reason[0].upper()}{reason[1:]}: its stored bytes are damaged. Run `flyarchive "
        "verify` on the archive to list every damaged chunk."
    )
    err.reason = reason  # type: ignore[attr-defined]
    return err


def _pcodec() -> Any:
    """pcodec's ``standalone`` module (imported on first use, then from ``sys.modules``)."""
    global _STANDALONE
    if _STANDALONE is None:
        from pcodec import standalone

        _STANDALONE = standalone
    return _STANDALONE


_STANDALONE: Any = None


class BoundedPCodec(DecodeHook, PCodec):
    """zarr's pcodec codec, decoding into the chunk's declared shape and never past it.

    pcodec compresses constant runs to a few bytes per 2**18 values, so a stored chunk of
    kilobytes can declare gigabytes. This decoder writes into an array of the chunk's
    shape and refuses data that holds more (or fewer) values: memory stays bounded by the
    declared chunk, which :func:`check_array_metadata` bounds in turn.
    """

    def decode_checked(self, chunk_data: Any, chunk_spec: Any) -> Any:
        out = np.empty(chunk_spec.shape, dtype=chunk_spec.dtype.to_native_dtype())
        self.decode_into(chunk_data, out, chunk_spec)
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(out)

    def decode_into(self, chunk_data: Any, out: np.ndarray, chunk_spec: Any) -> None:
        """Decode one chunk (a zarr ``Buffer`` or a ``uint8`` array) into ``out``: a
        C-contiguous array of the chunk's shape and native dtype (e.g. a view into a
        larger result, saving a copy).

        Raises:
            CorruptArchiveError: the bytes do not decode, or hold more or fewer values
                than the chunk's declared shape.
        """
        count = math.prod(chunk_spec.shape)
        data = chunk_data.tobytes() if isinstance(chunk_data, np.ndarray) else chunk_data.to_bytes()
        if out.size != count or not out.flags.c_contiguous:
            raise ValueError(f"decode_into needs a C-contiguous array of {count} values; "
                             f"got shape {out.shape}")
        try:
            progress = _pcodec().simple_decompress_into(data, out.reshape(count))
        except (RuntimeError, TypeError) as err:
            raise damaged(f"a pcodec chunk does not decode ({err})") from None
        if progress.n_processed != count or not progress.finished:
            raise damaged(
                f"a pcodec chunk holds more or fewer values than its declared shape "
                f"{tuple(chunk_spec.shape)} ({count} values); it was not decoded past them"
            )


class CheckedCrc32cCodec(DecodeHook, Crc32cCodec):
    """zarr's CRC-32C codec, reporting a mismatch as :class:`CorruptArchiveError` (a
    ``ValueError``, as before) that says what it means and what to run."""

    def decode_checked(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
        try:
            return self.decode_unchecked(chunk_bytes, chunk_spec)
        except ValueError as err:
            raise damaged(f"a stored chunk fails its CRC-32C checksum ({err})") from None


#: Bytes of a Blosc chunk header.
BLOSC_HEADER = 16


class BoundedBloscCodec(DecodeHook, BloscCodec):
    """zarr's Blosc codec, refusing a chunk whose header declares more bytes than the
    chunk's declared shape holds (a few stored bytes can declare gigabytes), before
    anything is allocated."""

    def decode_checked(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
        raw = chunk_bytes.as_numpy_array()
        if raw.nbytes < BLOSC_HEADER:
            raise damaged(f"a blosc chunk of {raw.nbytes} bytes is shorter than its header")
        declared, stored = (int(v) for v in raw[4:16].view("<u4")[[0, 2]])
        expected = math.prod(chunk_spec.shape) * chunk_spec.dtype.to_native_dtype().itemsize
        if declared > expected or stored != raw.nbytes:
            raise damaged(
                f"a blosc chunk declares {declared} bytes ({stored} stored in "
                f"{raw.nbytes}); its shape {tuple(chunk_spec.shape)} holds {expected}"
            )
        return self.decode_unchecked(chunk_bytes, chunk_spec)


_DECODERS = {"numcodecs.pcodec": BoundedPCodec, "crc32c": CheckedCrc32cCodec,
             "blosc": BoundedBloscCodec}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def install_bounded_decoders() -> None:
    """Make every zarr read in this process decode pcodec with :class:`BoundedPCodec` and
    check CRC-32C with :class:`CheckedCrc32cCodec`.

    Idempotent. Encoding is unchanged (the classes inherit it), so archives written
    before and after are identical.
    """
    chosen = dict(zarr.config.get("codecs", {}))
    if all(chosen.get(name) == _qualname(cls) for name, cls in _DECODERS.items()):
        return
    for name, cls in _DECODERS.items():
        zarr.registry.register_codec(name, cls, qualname=_qualname(cls))
        chosen[name] = _qualname(cls)
    # The whole mapping: a dotted key would nest ("numcodecs" -> "pcodec") where zarr
    # looks up the literal name "numcodecs.pcodec".
    zarr.config.set({"codecs": chosen})


def _copy_into(raw: np.ndarray, out: np.ndarray, spec: ArraySpec) -> None:
    """The bytes of a chunk stored plain (little-endian, native order here) copied into
    ``out``, a C-contiguous array of its shape.

    Raises:
        CorruptArchiveError: more or fewer bytes than the chunk's declared shape holds.
    """
    if raw.size != out.nbytes:
        raise damaged(f"a stored chunk holds {raw.size} bytes where its declared shape "
                      f"{tuple(spec.shape)} holds {out.nbytes}")
    out.reshape(-1).view(np.uint8)[:] = raw


def direct_decoder(codecs: Sequence[Any], spec: ArraySpec
                    ) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """A decoder of one inner chunk's bytes (``uint8``) into a C-contiguous array of its
    shape, for chains of bytes-to-bytes codecs and an array-to-bytes codec that decodes
    in place (``decode_into``: :class:`~flyarchive.store.decoders.BoundedPCodec`; plain
    little-endian bytes, copied); None for other chains (they decode through zarr's
    transform, then one copy).

    A CRC-32C codec that comes first in decoding order is checked here on the stored
    bytes without a copy; a mismatch is handed to the codec object itself, which raises
    its own error (CorruptArchiveError with flyarchive's decoders).
    """
    if any(isinstance(c, ArrayArrayCodec) for c in codecs):
        return None
    array_bytes = [c for c in codecs if isinstance(c, ArrayBytesCodec)]
    bytes_bytes = [c for c in codecs if isinstance(c, BytesBytesCodec)][::-1]  # decode order
    if len(array_bytes) != 1:
        return None
    if isinstance(array_bytes[0], BytesCodec):
        native = np.dtype(spec.dtype.to_native_dtype())
        if array_bytes[0].endian not in (None, sys.byteorder) or native.byteorder == ">" \
                or (native.byteorder == "=" and sys.byteorder != "little"):
            return None
        decode_into: Callable[[Any, np.ndarray, Any], None] = _copy_into
    elif hasattr(array_bytes[0], "decode_into"):
        decode_into = array_bytes[0].decode_into
    else:
        return None
    crc = bytes_bytes.pop(0) if bytes_bytes and isinstance(bytes_bytes[0], Crc32cCodec) else None
    wrap = default_buffer_prototype().buffer.from_array_like

    def decode(raw: np.ndarray, target: np.ndarray) -> None:
        if crc is not None:
            if raw.size < 4 or google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
                decode_sync(crc, wrap(raw), spec)  # raises the codec's own error
                raise ValueError("a stored chunk fails its CRC-32C checksum")
            raw = raw[:-4]
        if bytes_bytes:
            data = wrap(raw)
            for codec in bytes_bytes:
                data = decode_sync(codec, data, spec)
            raw = data.as_numpy_array()
        decode_into(raw, target, spec)

    return decode
