"""The benchmark scripts' shared tools (``scripts/benchlib.py``): what they print, write,
sample and build. No timing is asserted: timing belongs in the benchmarks themselves."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "benchlib.py"
_SPEC = importlib.util.spec_from_file_location("benchlib", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
benchlib = importlib.util.module_from_spec(_SPEC)
sys.modules["benchlib"] = benchlib  # dataclasses look their module up by name
_SPEC.loader.exec_module(benchlib)

MIB = 2**20
#: A child that holds 200 MiB of written (resident) memory for a second.
_HOLD_200_MIB = "import time; block = b'x' * (200 * 2**20); time.sleep(1.0)"


def test_table_prints_a_dash_for_a_missing_or_none_value() -> None:
    table = benchlib.Table([benchlib.Column("a", 3, "a"), benchlib.Column("b", 3, "b", ".1f")])

    lines = [table.line({"a": None, "b": 2.0}), table.line({})]

    assert lines == ["  - 2.0", "  -   -"]


def test_table_header_and_cells_use_each_columns_width_alignment_and_format() -> None:
    table = benchlib.Table([
        benchlib.Column("name", 6, "name", align="<"),
        benchlib.Column("MB", 7, lambda row: row["bytes"] / 1e6, ",.1f"),
    ])

    text = [table.header(), table.line({"name": "npz", "bytes": 1_234_567_890})]

    assert text == ["name        MB", "npz    1,234.6"]


def test_write_json_writes_the_result_and_nothing_without_a_path(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    result = {"meta": {"frames": 3}, "rows": [{"fps": 1.5}]}

    benchlib.write_json(None, result)
    written_without_path = list(tmp_path.iterdir())
    benchlib.write_json(str(path), result)

    assert written_without_path == []
    assert json.loads(path.read_text()) == result


def test_parse_size_rejects_text_that_is_not_height_x_width() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="'240x320x3' is not HEIGHTxWIDTH"):
        benchlib.parse_size("240x320x3")


@pytest.mark.parametrize("text", ["0x0", "0x320", "-2x4"])
def test_parse_size_rejects_sizes_of_nothing(text) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="both >= 1"):
        benchlib.parse_size(text)


def test_a_json_path_is_checked_before_the_run(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder"):
        benchlib.json_path(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        benchlib.json_path(str(tmp_path / "missing" / "x.json"))
    assert benchlib.json_path(str(tmp_path / "x.json")) == str(tmp_path / "x.json")


@pytest.mark.parametrize("text", ["-1", "two", "1.5"])
def test_nonnegative_int_rejects_what_is_not_a_whole_number_of_zero_or_more(text) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"whole number >= 0, got '{text}'"):
        benchlib.nonnegative_int(text)


def test_worker_counts_of_the_benchmarks_are_whole_numbers_of_zero_or_more() -> None:
    """bench_query --workers -1 started a LocalCluster of -1 workers and waited for ever."""
    import ast

    for name in ("bench_query.py", "bench_positions.py"):
        tree = ast.parse((_PATH.parent / name).read_text())
        kinds = [ast.unparse(k.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                 and node.args and getattr(node.args[0], "value", None) == "--workers"
                 for k in node.keywords if k.arg == "type"]
        assert kinds == ["nonnegative_int"], (name, kinds)


def test_parse_size_reads_height_then_width() -> None:
    assert benchlib.parse_size("240X320") == (240, 320)


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5"])
def test_positive_int_rejects_what_is_not_a_whole_number_of_one_or_more(text) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"whole number >= 1, got '{text}'"):
        benchlib.positive_int(text)


def test_positive_int_reads_a_count() -> None:
    assert benchlib.positive_int("5") == 5


#: Options of the benchmark scripts that count things (worlds, frames, rounds...): 0 or
#: less is a usage error, not a traceback or an empty table half-way through a run.
_COUNTS = {"worlds", "frames", "repeat", "nworld", "steps", "batch", "batch-worlds",
           "segment-frames", "chunk-frames", "shard-worlds", "reads", "commits", "videos",
           "scan-repeat", "clients"}


def _count_options(script: Path) -> list[tuple[str, str]]:
    """(option, the name its ``type=`` gives) of each counting option the script adds."""
    import ast

    found = []
    for node in ast.walk(ast.parse(script.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant)):
            continue
        option = str(node.args[0].value).removeprefix("--")
        kind = next((ast.unparse(k.value) for k in node.keywords if k.arg == "type"), "str")
        if option in _COUNTS or option.endswith(("-worlds", "-frames")):
            found.append((option, kind))
    return found


def test_every_benchmark_reads_its_counts_as_whole_numbers_of_one_or_more() -> None:
    scripts = sorted(_PATH.parent.glob("bench_*.py"))
    found = {s.name: _count_options(s) for s in scripts if s.name != "bench_gpu.py"}

    assert sum(map(len, found.values())) >= 50
    loose = {name: [o for o, kind in options if kind != "positive_int"]
             for name, options in found.items()}
    assert not any(loose.values()), loose


def test_a_benchmark_given_no_frames_stops_with_a_usage_error_before_any_work(tmp_path) -> None:
    script = _PATH.parent / "bench_cpu_replay.py"
    done = subprocess.run([sys.executable, str(script), "--frames", "0",
                           "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 2
    assert "argument --frames: must be a whole number >= 1, got '0'" in done.stderr
    assert not (tmp_path / "work").exists()


def test_host_info_reports_cores_memory_gpus_and_versions() -> None:
    info = benchlib.host_info()

    assert info["cpus"] == len(os.sched_getaffinity(0))
    assert info["memory_gib"] > 0
    assert isinstance(info["gpus"], list)
    assert info["versions"]["numpy"] == np.__version__
    assert info["versions"]["flyarchive"] != "missing"


@pytest.mark.subprocess
def test_peak_memory_of_a_pid_counts_what_that_process_holds() -> None:
    child = subprocess.Popen([sys.executable, "-c", _HOLD_200_MIB])

    with benchlib.PeakMemory(child.pid, interval_s=0.05, kind="pss") as memory:
        child.wait()

    assert memory.results["peak_bytes"] >= 200 * MIB
    assert memory.results["kind"] == "pss"


@pytest.mark.subprocess
def test_peak_memory_of_this_process_counts_its_children() -> None:
    before = benchlib.tree_memory()

    with benchlib.PeakMemory(interval_s=0.05) as memory:
        subprocess.run([sys.executable, "-c", _HOLD_200_MIB], check=True)

    assert memory.results["peak_bytes"] >= before + 200 * MIB


def test_cached_builds_once(tmp_path: Path) -> None:
    builds: list[Path] = []
    path = tmp_path / "data.zarr"

    for _ in range(2):
        benchlib.cached(path, lambda p: (builds.append(p), p.mkdir()))

    assert builds == [path]
    assert (tmp_path / "data.done").exists()


def test_cached_removes_what_an_interrupted_build_left_and_builds_again(tmp_path: Path) -> None:
    path = tmp_path / "data.zarr"
    path.mkdir()
    (path / "half-written").write_bytes(b"x")  # no .done marker: the build was interrupted

    benchlib.cached(path, lambda p: (p.mkdir(), (p / "whole").write_bytes(b"y")))

    assert sorted(p.name for p in path.iterdir()) == ["whole"]


def test_cached_builds_again_what_other_flyarchive_code_built(tmp_path: Path) -> None:
    builds: list[str] = []
    path = tmp_path / "data.zarr"
    benchlib.cached(path, lambda p: (builds.append("old"), p.mkdir()), stamp="0123456789ab")

    benchlib.cached(path, lambda p: (builds.append("new"), p.mkdir()))
    benchlib.cached(path, lambda p: (builds.append("again"), p.mkdir()))

    assert builds == ["old", "new"]
    assert f"stamp {benchlib.writer_stamp()}" in (tmp_path / "data.done").read_text()


def _walk(n_frames: int, nq: int = 10) -> np.ndarray:
    """A fake walk: a free joint (x, y, z, quaternion) then hinge angles, all distinct."""
    walk = np.arange(n_frames * nq, dtype=np.float64).reshape(n_frames, nq)
    walk[:, 3:7] = [1.0, 0.0, 0.0, 0.0]
    return walk


def test_jittered_moves_only_position_and_hinges_and_keeps_the_quaternion() -> None:
    base = _walk(30)
    jitter = benchlib.Jitter(start_margin=5, xy_mm=5.0, angle_bias_rad=0.01, angle_noise_rad=0.02)

    out = benchlib.jittered(base, 3, 25, jitter)

    assert out.shape == (3, 25, 10)
    np.testing.assert_array_equal(out[..., 3:7], np.broadcast_to([1.0, 0.0, 0.0, 0.0], (3, 25, 4)))
    assert not np.array_equal(out[0, :, 7:], out[1, :, 7:])
    starts = [int(np.argmin(np.abs(base[:, 2] - w[0, 2]))) for w in out]  # z is not jittered
    assert all(0 <= s <= 5 for s in starts)


def test_jittered_world_does_not_depend_on_how_many_worlds_there_are() -> None:
    base = _walk(40)
    jitter = benchlib.Jitter(start_margin=10)

    few, many = benchlib.jittered(base, 2, 30, jitter), benchlib.jittered(base, 6, 30, jitter)

    np.testing.assert_array_equal(few, many[:2])


def test_write_archive_stores_states_mocap_and_frame_times(tmp_path: Path) -> None:
    from flyarchive import open_archive

    states = benchlib.replay_states("tiny", 2, 7)
    url = str(tmp_path / "run.zarr")

    benchlib.write_archive(url, states.model, states.qpos, mocap=states.mocap, chunk_frames=3,
                           shard_worlds=2)
    ds = open_archive(url)

    expected_times = benchlib.frame_times(states.model, 7)
    np.testing.assert_array_equal(ds.qpos.values, states.qpos)
    np.testing.assert_array_equal(ds.mocap_pos.values, states.mocap[0])
    np.testing.assert_array_equal(ds.time.values, expected_times)
    assert str(ds.qpos.dtype) == "float32"


def test_cached_archive_does_not_compute_states_once_built(tmp_path: Path) -> None:
    states = benchlib.replay_states("tiny", 1, 4)
    calls: list[int] = []

    def compute() -> Any:
        calls.append(1)
        return states.qpos

    urls = [benchlib.cached_archive(tmp_path, "tiny-1x4", states.model, compute,
                                    mocap=states.mocap) for _ in range(2)]

    assert calls == [1]
    assert urls == [str(tmp_path / "tiny-1x4.zarr")] * 2


def test_imported_archive_goes_through_the_npz_import_and_keeps_the_model(tmp_path: Path) -> None:
    import mujoco

    from flyarchive import open_archive
    from flyarchive.models.kept import kept_model
    from flyarchive.testing import TWO_HINGES_XML

    model = mujoco.MjModel.from_xml_string(TWO_HINGES_XML)
    qpos = np.linspace(0.0, 1.0, 2 * 5 * 2).reshape(2, 5, 2)

    url = benchlib.imported_archive(tmp_path, "hinges", model, lambda: qpos)
    ds = open_archive(url)

    np.testing.assert_array_equal(ds.qpos.values, qpos)
    assert ds.attrs["source"] == "flygym-npz" and str(ds.qpos.dtype) == "float64"
    assert kept_model(url)[0].nq == model.nq
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hinges.done", "hinges.zarr"]


def test_a_model_exported_as_a_spec_zip_compiles_to_the_same_model(tmp_path: Path) -> None:
    import mujoco

    from flyarchive.testing import TINY_XML

    spec = mujoco.MjSpec.from_string(TINY_XML)
    spec.to_zip(str(tmp_path / "tiny.zip"))

    loaded = benchlib.load_bench_model(tmp_path / "tiny.zip")

    expected = mujoco.MjModel.from_xml_string(TINY_XML)
    assert (loaded.nq, loaded.nbody, loaded.ngeom) == (expected.nq, expected.nbody, expected.ngeom)
    np.testing.assert_array_equal(loaded.body_pos, expected.body_pos)


def test_listed_names_and_numbers_are_checked_as_options() -> None:
    assert benchlib.listed("tiny", "nmf")("tiny,nmf") == "tiny,nmf"
    with pytest.raises(argparse.ArgumentTypeError, match="'foo' given; choose from tiny, nmf"):
        benchlib.listed("tiny", "nmf")("tiny,foo")
    assert benchlib.numbers(1, whole=True)("1,2") == "1,2"
    for bad in ("0", "a", "1,-2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="must be whole numbers >= 1"):
            benchlib.numbers(1, whole=True)(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="finite number > 0"):
        benchlib.positive_float("nan")
    assert benchlib.positive_float("1e-6") == 1e-6


def test_pinning_to_a_core_the_machine_lacks_is_an_error_not_ignored() -> None:
    """bench_gait --core 99 ran unpinned and its table still said one core."""
    with pytest.raises(SystemExit, match=r"core\(s\) \[9999\] are not among"):
        benchlib.pin_threads({9999})
