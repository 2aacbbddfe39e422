"""``flyarchive demo``, the main job on embedded defaults, end to end (short): simulate,
record, verify, plot, render on one local Dask cluster (started while the flies walk,
used by both renders), and its refusal to overwrite an earlier demo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flyarchive import open_archive
from flyarchive.store.integrity import verify
from flyarchive.testing.markers import requires_flygym

pytestmark = [requires_flygym, pytest.mark.timeout(600)]

DEMO = [sys.executable, "-c", "from flyarchive.cli import run; run()", "demo"]


def test_the_demo_records_verifies_plots_and_renders_on_one_cluster(tmp_path, monkeypatch):
    from flyarchive.demo import run_demo
    from flyarchive.distribute import cluster as clusters

    started = []
    real = clusters._start_local
    monkeypatch.setattr(clusters, "_start_local",
                        lambda *a, **k: started.append(a[1:]) or real(*a, **k))

    done = run_demo(tmp_path / "demo", n_worlds=2, seconds=0.1, n_workers=2)

    assert started == [(2, None)]  # one cluster, started early, for both renders
    assert done["verify_ok"] and verify(done["archive"]).ok
    ds = open_archive(done["archive"])
    assert ds.sizes["world"] == 2 and int(ds.n_frames.min()) == done["frames"] > 0
    manifest = json.loads((tmp_path / "demo" / "videos" / "manifest.json").read_text())
    assert {v["path"] for v in manifest["videos"]} >= set(done["mosaics"])
    for path in [*done["videos"], *done["mosaics"], done["plot"]]:
        assert Path(path).is_absolute() and Path(path).stat().st_size > 0, path


def test_the_demo_command_refuses_to_overwrite_an_earlier_demo(tmp_path):
    out = tmp_path / "demo"
    first = subprocess.run([*DEMO, "--out", str(out), "--worlds", "2", "--seconds", "0.05",
                            "--no-render"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert f"flyarchive view {out / 'demo.zarr'} --out {out / 'view-videos'}" in first.stdout
    before = (out / "demo.zarr" / "zarr.json").read_bytes()

    again = subprocess.run([*DEMO, "--out", str(out), "--no-render"], capture_output=True,
                           text=True, timeout=300)

    assert again.returncode == 2
    assert "holds an earlier demo" in again.stderr and "--overwrite" in again.stderr
    assert (out / "demo.zarr" / "zarr.json").read_bytes() == before
