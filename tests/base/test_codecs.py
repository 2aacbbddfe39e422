"""Codec specs and pipelines (flyarchive.codecs), through real zarr arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest
import zarr

from flyarchive import codecs
from flyarchive.errors import FlyarchiveError


def _write(path, values: np.ndarray, spec: str) -> zarr.Array:
    """Store ``values`` (world, time, ...) as the archive does: one shard, chunks of one world."""
    shape = values.shape
    arr = zarr.create_array(
        zarr.storage.LocalStore(path), name="state", shape=shape, dtype=values.dtype,
        chunks=(1, *shape[1:]), shards=shape, fill_value=np.nan,
        **codecs.array_codecs(spec, values.dtype),
    )
    arr[:] = values
    return arr


def _random_walk(shape: tuple[int, ...], dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(0.0, 0.05, shape), axis=1).astype(dtype)


@pytest.mark.parametrize(
    "spec", ["", "lossy", "abs:", "abs:x", "abs:0", "abs:-1e-6", "abs:nan", "abs:inf", "ABS:1e-6"]
)
def test_unknown_spec_is_rejected_with_the_accepted_forms(spec):
    with pytest.raises(codecs.CodecSpecError, match="'lossless'.*'abs:<bound>'") as info:
        codecs.parse_codec(spec)

    assert isinstance(info.value, ValueError) and isinstance(info.value, FlyarchiveError)
    assert repr(spec) in str(info.value)


def test_non_string_spec_is_rejected():
    with pytest.raises(codecs.CodecSpecError):
        codecs.parse_codec(1e-6)  # type: ignore[arg-type]


def test_parse_codec_returns_the_bound():
    assert codecs.parse_codec("lossless") is None
    assert codecs.parse_codec("abs:1e-6") == 1e-6


@pytest.mark.parametrize("bound", [1e-6, 2.0**-20, 3e-3, 0.5, 7.0])
def test_quantization_step_is_the_largest_power_of_two_within_twice_the_bound(bound):
    step = codecs.quantization_step(bound)

    assert math.log2(step) == int(math.log2(step))
    assert step / 2 <= bound < step


def test_quantization_step_rejects_a_non_positive_bound():
    with pytest.raises(codecs.CodecSpecError, match="positive"):
        codecs.quantization_step(0.0)


def test_array_codecs_rejects_integer_state():
    with pytest.raises(codecs.CodecSpecError, match="float64 or float32"):
        codecs.array_codecs("lossless", np.int64)


def test_every_pipeline_ends_with_a_checksum():
    for spec in ("lossless", "abs:1e-6"):
        for dtype in (np.float64, np.float32):
            last = codecs.array_codecs(spec, dtype)["compressors"][-1]

            assert isinstance(last, zarr.codecs.Crc32cCodec)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lossless_round_trip_is_bit_exact(tmp_path, dtype):
    expected = _random_walk((2, 50, 13), dtype)
    expected[0, 0, :5] = [-0.0, np.nan, np.inf, -np.inf, np.finfo(dtype).smallest_subnormal]

    actual = _write(tmp_path, expected, "lossless")[:]

    assert actual.dtype == expected.dtype
    assert actual.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bound", [1e-6, 1e-3])
def test_abs_bound_is_respected_on_a_random_walk(tmp_path, dtype, bound):
    values = _random_walk((2, 200, 13), dtype) * 100.0  # up to ~100 units, like mm

    stored = _write(tmp_path, values, f"abs:{bound}")[:]

    error = np.abs(stored.astype(np.float64) - values.astype(np.float64))
    assert stored.dtype == values.dtype
    assert error.max() <= bound
    assert codecs.on_grid(stored, f"abs:{bound}").all()


def test_abs_codec_keeps_nan_from_partly_written_chunks(tmp_path):
    values = _random_walk((1, 20, 3), np.float64)
    arr = _write(tmp_path, np.full_like(values, np.nan), "abs:1e-6")

    arr[:, :10] = values[:, :10]

    assert np.isnan(arr[:, 10:]).all()
    assert np.abs(arr[:, :10] - values[:, :10]).max() <= 1e-6


def test_pipeline_suits_mocap_shaped_arrays(tmp_path):
    expected = _random_walk((2, 30, 2, 4), np.float32)

    actual = _write(tmp_path, expected, "lossless")[:]

    assert actual.tobytes() == expected.tobytes()


def test_on_grid_detects_values_off_the_grid():
    step = codecs.quantization_step(1e-6)
    values = np.array([3 * step, 3.5 * step, np.nan])

    assert codecs.on_grid(values, "abs:1e-6").tolist() == [True, False, True]
    assert codecs.on_grid(values, "lossless").all()


@pytest.mark.parametrize("spec", ["lossless", "abs:1e-6"])
def test_flipped_byte_in_a_stored_chunk_raises_on_read(tmp_path, spec):
    arr = _write(tmp_path, _random_walk((1, 100, 7), np.float64), spec)
    shard = tmp_path / "state" / "c" / "0" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[len(data) // 4] ^= 0x01
    shard.write_bytes(bytes(data))

    with pytest.raises(ValueError, match="checksum"):
        zarr.open_array(zarr.storage.LocalStore(tmp_path), path="state")[:]
    del arr


def test_describe_names_bound_step_and_pipeline():
    expected = {
        "spec": "abs:1e-6",
        "lossless": False,
        "abs_error_bound": 1e-6,
        "quantization_step": 2.0**-19,
    }

    actual = codecs.describe("abs:1e-6")

    assert {k: actual[k] for k in expected} == expected
    assert actual["pipeline"][-1] == "crc32c"
    assert codecs.describe("lossless")["quantization_step"] is None
