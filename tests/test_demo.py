"""``flyarchive demo``, the main job on embedded defaults, end to end (short): simulate,
record, verify, plot, render on one local Dask cluster (started while the flies walk,
used by both renders), run once; and the command's refusal to overwrite that demo."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flyarchive import open_archive
from flyarchive.store.integrity import verify
from flyarchive.testing.markers import requires_flygym

pytestmark = [requires_flygym, pytest.mark.timeout(600)]

DEMO = [sys.executable, "-c", "from flyarchive.cli import run; run()", "demo"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``flyarchive demo`` of 2 worlds, 0.05 s (7 frames), 1 render worker, run once (in this process,
    through the command line's entry point): its output folder, exit code, what it printed
    and the local clusters it started."""
    from flyarchive.cli import main
    from flyarchive.distribute import cluster as clusters

    out = tmp_path_factory.mktemp("demo") / "demo"
    started = []
    real = clusters._start_local
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(clusters, "_start_local",
                      lambda *a, **k: started.append(a[1:]) or real(*a, **k))
        code = main(["demo", "--out", str(out), "--worlds", "2", "--seconds", "0.05",
                     "--workers", "1"])
    return out, code, printed.getvalue(), started


def test_the_demo_records_verifies_plots_and_renders_on_one_cluster(demo):
    out, code, printed, started = demo
    archive = out / "demo.zarr"

    assert code == 0, printed
    assert started == [(1, None)]  # one cluster, started early, for both renders
    assert "verify: OK" in printed and verify(str(archive)).ok
    ds = open_archive(str(archive))
    frames = int(ds.n_frames.min())
    assert ds.sizes["world"] == 2 and frames > 0
    assert f"recorded {frames} frames x 2 worlds to {archive}" in printed
    manifest = json.loads((out / "videos" / "manifest.json").read_text())
    videos = [Path(v["path"]) for v in manifest["videos"]]
    assert {v.parent.name for v in videos} == {"world00000", "world00001", "mosaic000"}
    for path in [*videos, out / "world0.png"]:
        assert path.is_absolute() and path.stat().st_size > 0, path
    assert f"flyarchive view {archive} --out {out / 'view-videos'}" in printed


def test_the_demo_archive_keeps_the_portable_form_of_neuromechfly(demo):
    from flyarchive.models import PORTABLE_MODEL_ATTR, compile_spec_zip, load_model_file, model_identity
    from flyarchive.models.kept import read_portable
    from flyarchive.store.opener import open_for_reading

    out = demo[0]
    url = str(out / "demo.zarr")

    blob, entry = read_portable(open_for_reading(url, attributes_only=True), url)

    assert model_identity(open_archive(url).attrs) == entry["sha256"]
    assert PORTABLE_MODEL_ATTR in open_archive(url).attrs and len(entry["qpos0"]) == 73
    recorded = load_model_file(out / "nmf.mjb")
    kept = compile_spec_zip(blob)
    assert kept.nmesh == recorded.nmesh > 0 and kept.nq == recorded.nq
    assert all(not name.startswith("/") for name in zipfile.ZipFile(io.BytesIO(blob)).namelist())


def test_the_demo_command_refuses_to_overwrite_an_earlier_demo(demo):
    out = demo[0]
    before = (out / "demo.zarr" / "zarr.json").read_bytes()

    again = subprocess.run([*DEMO, "--out", str(out), "--no-render"], capture_output=True,
                           text=True, timeout=300)

    assert again.returncode == 2
    assert "holds an earlier demo" in again.stderr and "--overwrite" in again.stderr
    assert (out / "demo.zarr" / "zarr.json").read_bytes() == before


@pytest.mark.parametrize(("args", "message"), [
    (["--worlds", "0"], "n_worlds must be a positive integer, got 0"),
    (["--seconds", "nan"], "seconds must be a finite number >= 0, got nan"),
    (["--seconds", "-1"], "seconds must be a finite number >= 0, got -1.0"),
    (["--workers", "-1"], "n_workers must be None (one worker per core) or a whole number >= 0"),
])
def test_the_demo_refuses_a_wrong_count_before_writing_anything(tmp_path, capsys, args, message):
    from flyarchive.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "nmf.mjb").write_bytes(b"mine")

    code = main(["demo", "--out", str(out), "--overwrite", *args])

    assert code == 2 and message in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["nmf.mjb"]
    assert (out / "nmf.mjb").read_bytes() == b"mine"


@pytest.mark.parametrize("name", ["nmf.mjb", "world0.png", "videos"])
def test_the_demo_replaces_none_of_its_outputs_found_in_its_folder_unasked(tmp_path, capsys, name):
    from flyarchive.cli import main

    out = tmp_path / "out"
    out.mkdir()
    if name == "videos":
        (out / name).mkdir()
        (out / name / "mine.mp4").write_bytes(b"mine")
    else:
        (out / name).write_bytes(b"mine")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))

    code = main(["demo", "--out", str(out), "--no-render"])

    err = capsys.readouterr().err
    assert code == 2 and f"holds {name}, which the demo writes" in err and "--overwrite" in err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert (out / name / "mine.mp4" if name == "videos" else out / name).read_bytes() == b"mine"


def test_the_demo_refuses_a_file_or_an_archive_as_its_folder(tmp_path, capsys):
    from flyarchive.cli import main

    afile, group = tmp_path / "afile.txt", tmp_path / "run.zarr"
    afile.write_text("mine")
    group.mkdir()
    (group / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')

    codes = [main(["demo", "--out", str(afile)]), main(["demo", "--out", str(group)])]

    err = capsys.readouterr().err
    assert codes == [2, 2]
    assert "is a file, not a folder" in err and "is a zarr archive or group" in err
    assert afile.read_text() == "mine" and [p.name for p in group.iterdir()] == ["zarr.json"]
