"""Codec pipelines for the archive's state arrays, chosen by measurement.

``"lossless"`` (default) keeps every bit and is the smallest. ``"portable"`` keeps
every bit too, with only codecs of the zarr v3 core specification (``transpose``,
``bytes``, ``blosc``, ``crc32c``, inside ``sharding_indexed``), so that any zarr v3
reader decodes it, in any language, without pcodec. ``"abs:<bound>"`` (e.g. ``"abs:1e-6"``)
rounds every value to the nearest multiple of a power-of-two grid step (the
largest one not above ``2 * bound``, see :func:`quantization_step`), so that the
absolute error is at most ``bound``, then compresses losslessly. NaN and
infinities pass through unchanged. Every pipeline ends with a CRC-32C checksum,
so flipped bits are detected on read.

The pipelines (``scripts/bench_storage.py`` measures them on a NeuroMechFly walk,
73 dofs, 250 frames at 25 fps and playback 0.2, float64; ratio to
``np.savez_compressed`` of the same array):

- lossless: ``pcodec`` (level 8, lookback delta) then CRC-32C: 0.84, where Blosc
  shuffle+zstd reaches 0.89-0.91.
- portable: transpose so that time varies fastest within each dof, then Blosc
  (zstd level 5, byte shuffle) then CRC-32C: 0.89 (float32: 0.84, where pcodec
  reaches 0.77); without the transpose 0.92; zstd level 8 gains 1.4 % for an
  encoder 2-3 times slower; bit shuffle, plain zstd or gzip reach only about 1.0.
- ``abs:1e-6``: a fixed-scale quantizer (``numcodecs.fixedscaleoffset``, scale
  ``2**19``, float output) then the same ``pcodec`` then CRC-32C: 0.27, max error
  ``2**-20`` (9.5e-7).

The lookback delta lets pcodec find the frame period (``nq`` values) itself, so the
same pipeline suits every state array, whatever its trailing dimensions.
Reading ``lossless`` and ``abs`` archives needs ``numcodecs`` and ``pcodec``
(``pip install 'numcodecs[pcodec]'``); :func:`reader_needs` says it for each spec.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, TransposeCodec
from zarr.codecs.numcodecs import FixedScaleOffset, PCodec

from flyarchive.errors import CodecSpecError

_PCODEC_LEVEL = 8
_PCODEC_DELTA = "try_lookback"
_BLOSC_CNAME = "zstd"
_BLOSC_LEVEL = 5
_BLOSC_SHUFFLE = "shuffle"

#: The spec of the portable pipeline (zarr v3 core codecs only).
PORTABLE = "portable"
_SPECS = "'lossless' (default, smallest), 'portable' (any zarr v3 reader) or 'abs:<bound>'"




def parse_codec(spec: str) -> float | None:
    """Return the absolute error bound of a codec spec (None for lossless).

    Args:
        spec: ``"lossless"``, ``"portable"`` (both lossless) or ``"abs:<bound>"`` with a
            positive finite bound in the units of the stored values (mm, radians...),
            e.g. ``"abs:1e-6"``.

    Raises:
        CodecSpecError: for anything else.
    """
    if spec in ("lossless", PORTABLE):
        return None
    if isinstance(spec, str) and spec.startswith("abs:"):
        try:
            bound = float(spec[4:])
        except ValueError:
            bound = float("nan")
        if math.isfinite(bound) and bound > 0:
            return bound
    raise CodecSpecError(
        f"Unknown codec {spec!r}. Use {_SPECS}, e.g. 'abs:1e-6' for an absolute "
        "error bound."
    )


def quantization_step(bound: float) -> float:
    """The grid step used for an absolute error bound.

    The step is the largest power of two not above ``2 * bound``, so rounding to the
    nearest multiple errs by at most ``step / 2 <= bound``, and scaling by a power of
    two is exact in floating point. ``quantization_step(1e-6) == 2**-19``.

    Args:
        bound: Positive finite absolute error bound.

    Raises:
        CodecSpecError: if ``bound`` is not positive and finite.
    """
    if not (isinstance(bound, (int, float)) and math.isfinite(bound) and bound > 0):
        raise CodecSpecError(f"An error bound must be a positive finite number, got {bound!r}.")
    _, exponent = math.frexp(2.0 * bound)  # 2 * bound = m * 2**exponent, 0.5 <= m < 1
    return math.ldexp(1.0, exponent - 1)


def array_codecs(spec: str, dtype: np.typing.DTypeLike, *, ndim: int = 3) -> dict[str, Any]:
    """Keyword arguments (``filters``, ``serializer``, ``compressors``) for ``zarr.create_array``.

    Suits state arrays of any shape (``(world, time, dof)``, ``(world, time, mocap, 3|4)``)
    chunked with all trailing dimensions in one chunk.

    Args:
        spec: ``"lossless"``, ``"portable"`` or ``"abs:<bound>"``.
        dtype: The array's dtype, float64 or float32.
        ndim: The array's number of dimensions (>= 2, time on axis 1): 3 for ``qpos``,
            4 for ``mocap_pos``/``mocap_quat``. Only the portable pipeline depends on
            it (its transpose moves time last).

    Raises:
        CodecSpecError: for an unknown spec, a dtype other than float32/float64, or
            ``ndim < 2``.
    """
    bound = parse_codec(spec)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype("float64"), np.dtype("float32")):
        raise CodecSpecError(f"State arrays are float64 or float32, got dtype {dtype!r}.")
    if not (isinstance(ndim, int) and ndim >= 2):
        raise CodecSpecError(
            f"State arrays have at least 2 dimensions (world, time), got ndim={ndim!r}."
        )
    if spec == PORTABLE:
        return _portable_codecs(dtype, ndim)
    filters: list[Any] = []
    if bound is not None:
        scale = 1.0 / quantization_step(bound)
        filters.append(FixedScaleOffset(offset=0, scale=scale, dtype=dtype.str, astype=dtype.str))
    return {
        "filters": filters,
        "serializer": PCodec(level=_PCODEC_LEVEL, delta_spec=_PCODEC_DELTA),
        "compressors": [Crc32cCodec()],
    }


def plain_codecs() -> dict[str, Any]:
    """Keyword arguments for ``zarr.create_array`` of derived state arrays (kept positions):
    the values' little-endian bytes and a CRC-32C, no compression. Positions in float64
    compress by 15-25 % with pcodec (their low bits are noise), and decode at a third of
    the speed: a gait over kept positions is bound by reading them."""
    return {"serializer": BytesCodec(endian="little"), "compressors": [Crc32cCodec()]}


def _portable_codecs(dtype: np.dtype, ndim: int) -> dict[str, Any]:
    """zarr v3 core codecs only: time last (varies fastest), Blosc zstd with byte shuffle."""
    return {
        "filters": [TransposeCodec(order=(0, *range(2, ndim), 1))],
        "serializer": BytesCodec(),  # little-endian
        "compressors": [
            BloscCodec(cname=_BLOSC_CNAME, clevel=_BLOSC_LEVEL, shuffle=_BLOSC_SHUFFLE,
                       typesize=dtype.itemsize),
            Crc32cCodec(),
        ],
    }


def reader_needs(spec: str) -> str:
    """What a reader needs to decode an archive written with ``spec``, in words.

    Raises:
        CodecSpecError: for an unknown spec.
    """
    parse_codec(spec)
    if spec == PORTABLE:
        return "any zarr v3 reader (core codecs only); Python: pip install zarr xarray"
    return "zarr>=3 with numcodecs[pcodec]; Python: pip install zarr xarray 'numcodecs[pcodec]'"


def describe(spec: str) -> dict[str, Any]:
    """The JSON-friendly description of a codec spec for the archive's attributes.

    Returns:
        ``{"spec", "codec", "lossless", "abs_error_bound", "quantization_step",
        "pipeline", "reader_needs"}``: ``codec`` names the compressor (``"pcodec"`` or
        ``"blosc-zstd"``), ``reader_needs`` what a reader must have installed (see
        :func:`reader_needs`); the bound and the step are None for lossless specs.

    Raises:
        CodecSpecError: for an unknown spec.
    """
    bound = parse_codec(spec)
    step = None if bound is None else quantization_step(bound)
    if spec == PORTABLE:
        codec = "blosc-zstd"
        stages = ["transpose(time last)", "bytes",
                  f"blosc(cname={_BLOSC_CNAME}, clevel={_BLOSC_LEVEL}, shuffle={_BLOSC_SHUFFLE})",
                  "crc32c"]
    else:
        codec = "pcodec"
        stages = [f"pcodec(level={_PCODEC_LEVEL}, delta={_PCODEC_DELTA})", "crc32c"]
    if step is not None:
        stages.insert(0, f"round to multiples of 2**{int(math.log2(step))}")
    return {
        "spec": spec,
        "codec": codec,
        "lossless": bound is None,
        "abs_error_bound": bound,
        "quantization_step": step,
        "pipeline": stages,
        "reader_needs": reader_needs(spec),
    }


def on_grid(values: np.ndarray, spec: str) -> np.ndarray:
    """Whether each value is what the spec can store: on its grid (always True for lossless).

    NaN and infinities count as on the grid (they pass through unchanged).

    Args:
        values: Stored values, any shape, float32 or float64.
        spec: The archive's codec spec.

    Returns:
        Boolean array of ``values.shape``.
    """
    bound = parse_codec(spec)
    values = np.asarray(values)
    if bound is None:
        return np.ones(values.shape, dtype=bool)
    scaled = values / quantization_step(bound)  # exact: a power-of-two scale
    return ~np.isfinite(scaled) | (scaled == np.round(scaled))
