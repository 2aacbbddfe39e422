"""open_header: what a render plans with, read without xarray or dask, equal to what
open_archive reads (same variables, dims, dtypes, shapes, values, attributes; same
checks), and a render without a where mask imports neither xarray, pandas nor dask, nor
does ``flyarchive info`` (both checked in one fresh process, before a render with a mask
imports xarray there); that Warp render, the first in its process, prints no Warp logs."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.errors import SchemaError
from flyarchive.store.dataset import open_header
from flyarchive.store.world_vars import add_world_vars
from flyarchive.testing.synthetic import write_random


def _archive(location):
    committed = np.array([40, 25, 0, 40, 33, 40])
    write_random(location.url, n_worlds=6, world_ids=[3, 5, 8, 13, 21, 34], committed=committed,
                 storage_options=location.storage_options)
    add_world_vars(location.url, {"success": [1, 0, 1, 1, 0, 1],
                                  "gain": [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]},
                   storage_options=location.storage_options)
    return location


def test_the_header_holds_what_the_dataset_holds_but_state(location):
    _archive(location)
    ds = open_archive(location.url, location.storage_options)
    header = open_header(location.url, location.storage_options)

    assert header.attrs == ds.attrs
    assert dict(header.sizes) == dict(ds.sizes)
    assert sorted(header.coords) == sorted(ds.coords)
    assert sorted(header.data_vars) == sorted(ds.data_vars)
    assert {"qpos", "mocap_pos", "mocap_quat", "success", "gain"} <= set(header.data_vars)
    for name, var in ds.variables.items():
        got = header[name]
        assert (got.dims, got.dtype, got.shape, got.attrs) == \
            (var.dims, var.dtype, var.shape, dict(var.attrs)), name
        if name not in ("qpos", "mocap_pos", "mocap_quat"):
            np.testing.assert_array_equal(got.values, var.values, err_msg=name)
    assert getattr(header, "n_frames") is header["n_frames"]
    assert list(header.n_frames.values) == [40, 25, 0, 40, 33, 40]
    assert "success" in header and "nothing" not in header


def test_state_is_not_read_from_a_header_and_says_what_reads_it(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=2)
    header = open_header(url)
    with pytest.raises(TypeError, match=r"'qpos' is state.*open_archive"):
        header.qpos.values
    with pytest.raises(KeyError, match="no variable 'speed'"):
        header["speed"]
    with pytest.raises(AttributeError, match="speed"):
        header.speed


def test_the_header_checks_the_archive_as_open_archive_does(tmp_path):
    url = tmp_path / "run.zarr"
    write_random(str(url), n_worlds=2)
    meta = json.loads((url / "zarr.json").read_text())
    meta["attributes"]["output_fps"] = "fast"
    (url / "zarr.json").write_text(json.dumps(meta))

    with pytest.raises(SchemaError) as from_dataset:
        open_archive(str(url))
    with pytest.raises(SchemaError) as from_header:
        open_header(str(url))
    assert str(from_header.value) == str(from_dataset.value)
    assert "output_fps" in str(from_header.value)


def test_a_header_with_repeated_world_ids_is_refused_like_the_dataset(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=3)
    import zarr

    zarr.open_array(f"{url}/world", mode="r+")[:] = [4, 4, 5]
    with pytest.raises(SchemaError, match="repeats a world id"):
        open_archive(url)
    with pytest.raises(SchemaError, match="repeats a world id"):
        open_header(url)


#: Runs ``flyarchive`` once per argv of the JSON list ``argv[1]``, in this order, and after
#: each says ``RESULT {"rc": ..., "heavy": [...]}`` (the heavy modules imported so far) on
#: stdout and ``RESULT`` on stderr.
_COMMANDS = textwrap.dedent("""
    import json, sys
    from flyarchive.cli import main
    for argv in json.loads(sys.argv[1]):
        rc = main(argv)
        heavy = [m for m in ("xarray", "pandas", "dask", "dask.array") if m in sys.modules]
        print("RESULT", json.dumps({"rc": rc, "heavy": heavy}), flush=True)
        print("RESULT", file=sys.stderr, flush=True)
""")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """In one fresh process: a Warp render without a where mask (Warp starts in it),
    ``flyarchive info`` and a render with one, in that order (imports only grow); per
    command its output (the lines it printed), what it wrote to stderr, its exit status
    and the heavy modules imported after it."""
    from flyarchive.testing import TINY_XML

    tmp = tmp_path_factory.mktemp("imports")
    model = tmp / "tiny.xml"
    model.write_text(TINY_XML)
    url = str(tmp / "run.zarr")
    write_random(url, n_worlds=2, n_frames=4, chunk_frames=4)
    add_world_vars(url, {"success": [1, 0]})
    info_url = str(tmp / "info.zarr")
    write_random(info_url, n_worlds=3, n_frames=4, chunk_frames=4, committed=np.array([4, 2, 0]))
    add_world_vars(info_url, {"success": [1, 0, 1]})

    def render(out, *where):
        return ["render", url, "--model", str(model), "--camera", "front", "--size", "48x64",
                "--backend", "warp-cpu", "--workers", "0", "--out", str(tmp / out), "--quiet",
                *where]

    commands = {"render": render("all"), "info": ["info", "--json", info_url],
                "render where": render("where", "--where-world-var", "success=1")}
    run = subprocess.run([sys.executable, "-c", _COMMANDS, json.dumps(list(commands.values()))],
                         capture_output=True, text=True, env={**os.environ, "MUJOCO_GL": "egl"},
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    said, printed = {}, []
    names = iter(commands)
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            said[next(names)] = {**json.loads(line[len("RESULT "):]), "printed": printed}
            printed = []
        else:
            printed.append(line)
    for name, err in zip(commands, run.stderr.split("RESULT\n")):
        said[name]["stderr"] = err
    said["render"]["out"], said["render where"]["out"] = tmp / "all", tmp / "where"
    return said


@pytest.mark.subprocess
def test_a_render_without_a_where_mask_imports_no_xarray_pandas_or_dask(one_process):
    result = one_process["render"]

    manifest = json.loads((result["out"] / "manifest.json").read_text())
    assert result["rc"] == 0
    assert [v["world"] for v in manifest["videos"]] == [0, 1]
    assert [v["frame_range"] for v in manifest["videos"]][0] == [0, 4]
    assert result["heavy"] == []


@pytest.mark.subprocess
def test_a_warp_render_prints_no_warp_logs(one_process):
    result = one_process["render"]  # Warp is imported and initialized in this render

    assert result["stderr"] == ""
    assert len(result["printed"]) == 1 and result["printed"][0].startswith("wrote 2 video(s)")


@pytest.mark.subprocess
def test_a_render_with_a_where_mask_computes_it_with_xarray(one_process):
    result = one_process["render where"]

    manifest = json.loads((result["out"] / "manifest.json").read_text())
    assert result["rc"] == 0
    assert [v["world"] for v in manifest["videos"]] == [0]
    assert [v["frame_range"] for v in manifest["videos"]][0] == [0, 4]
    assert "xarray" in result["heavy"]  # the mask is computed with xarray: it is imported then


@pytest.mark.subprocess
def test_flyarchive_info_reads_the_header_without_xarray_pandas_or_dask(one_process):
    result = one_process["info"]  # after a render without a mask, in the same process

    info = json.loads("\n".join(result["printed"]))
    assert result["rc"] == 0
    assert (info["worlds"], info["frames_min"], info["frames_max"]) == (3, 0, 4)
    assert (info["world_vars"], info["dtype"], info["nq"]) == (["success"], "float64", 13)
    assert result["heavy"] == []
