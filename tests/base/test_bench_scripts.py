"""Every benchmark script runs its rows end to end at the smallest sizes, as a developer
runs it: the process exits 0, prints its table and writes its JSON with numbers in it.
Nothing is timed here (timing belongs in the benchmarks); a row that breaks fails here
instead of on the day someone measures with it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

#: Each script with arguments that keep it to seconds (tiny models or a few NeuroMechFly
#: frames, Warp's CPU device, no S3 where a row would start the server only to time it).
CASES: dict[str, list[str]] = {
    "bench_keep.py": ["--tiny", "--worlds", "2", "--frames", "20", "--repeat", "1"],
    "bench_models.py": ["--models", "tiny", "--repeat", "1"],
    "bench_reads.py": ["--reads", "2", "--repeat", "1"],
    "bench_storage.py": ["--frames", "20", "--worlds", "2", "--repeat", "1"],
    "bench_encode.py": ["--size", "32x32", "--frames", "8", "--videos", "2", "--jobs", "1",
                        "--presets", "ultrafast"],
    "bench_gait.py": ["--worlds", "2", "--frames", "50", "--big-worlds", "2", "--big-frames",
                      "50", "--repeat", "1"],
    "bench_open.py": ["--worlds", "2", "--frames", "20", "--repeat", "1", "--no-s3"],
    "bench_record_small.py": ["--repeat", "1", "--commits", "2", "--no-nmf"],
    "bench_gpu_render.py": ["--device", "cpu", "--model", "tiny", "--worlds", "2", "--frames",
                            "4", "--size", "32x32"],
    "bench_gpu_record.py": ["--device", "cpu", "--model", "tiny", "--nworld", "2", "--steps",
                            "4"],
    "bench_outputs.py": ["--model", "tiny", "--worlds", "1", "--frames", "4", "--size",
                         "32x32", "--repeat", "1", "--backends", "cpu"],
    "bench_view.py": ["--part", "page", "--worlds", "4", "--frames", "20", "--repeat", "1"],
}


def numbers(value: Any) -> list[float]:
    """Every number in a JSON value."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("script", sorted(CASES))
def test_a_benchmark_runs_its_rows_and_writes_its_json(script, tmp_path):
    if script == "bench_view.py":
        pytest.importorskip("playwright", reason="the view extra is not installed")
    out = tmp_path / "result.json"
    args = list(CASES[script])
    if "--cache" in _options(script):
        args += ["--cache", str(tmp_path / "cache")]
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}

    done = subprocess.run([sys.executable, str(SCRIPTS / script), *args, "--json", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)

    assert done.returncode == 0, f"{script}: {done.stderr[-3000:]}"
    assert f"wrote {out}" in done.stdout + done.stderr
    result = json.loads(out.read_text())
    found = numbers(result)
    assert found and any(math.isfinite(n) and n > 0 for n in found), result
    table = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(table) >= 3, done.stdout  # a header and rows, not only the "wrote" line


def _options(script: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], capture_output=True,
                          text=True, timeout=120).stdout
