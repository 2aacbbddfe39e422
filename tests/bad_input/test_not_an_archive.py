"""A URL that is not an archive but lies inside one (run.zarr/qpos), or is a depth or
segmentation map that flyarchive render wrote: a clear error naming what is there and
what to open instead, never "tampered"; nothing is changed."""

import json
import uuid

import numpy as np
import pytest
import zarr

from flyarchive import open_archive
from flyarchive.errors import ArchiveNotFoundError
from flyarchive.testing.checksums import upload
from flyarchive.testing.fixtures import snapshot
from flyarchive.video.maps import MapWriter, depth_attrs, segmentation_attrs

BUCKET = "flyarchive-test"  # created by the s3_server fixture


@pytest.fixture
def maps(tmp_path):
    """A depth map and a segmentation map as `flyarchive render` writes them."""
    made = {}
    for kind, attrs in (("depth", depth_attrs(0.001, 10.0)), ("seg", segmentation_attrs())):
        path = tmp_path / "videos" / "world00000" / f"front.{kind}.zarr"
        writer = MapWriter(path, (8, 10), 3, attrs)
        writer.write(np.ones((3, 8, 10), np.uint16))
        writer.close()
        made[kind] = str(path)
    return made


@pytest.mark.parametrize("command", ["verify", "info"])
@pytest.mark.parametrize("inside", ["qpos", "time", "qpos/", "qpos/c", "claims"])
def test_a_path_inside_an_archive_names_the_archive_to_use(archive, cli, command, inside):
    before = snapshot(archive)

    code, out, err = cli(command, f"{archive}/{inside}")

    assert code == 2
    assert out == ""
    name = inside.rstrip("/")
    what = f"the array {name!r}" if name in ("qpos", "time") else repr(name)
    assert f"it is {what} inside the archive at {archive!r}. Pass the archive's URL instead, " \
           f"e.g. `flyarchive verify {archive}`" in err
    assert "tampered" not in err
    assert snapshot(archive) == before


def test_open_archive_of_an_array_inside_an_archive_names_the_archive(archive):
    with pytest.raises(ArchiveNotFoundError, match=f"inside the archive at {archive!r}"):
        open_archive(f"{archive}/n_frames")


def test_a_relative_path_inside_an_archive_names_it_as_written(archive, cli, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(archive).parent)

    code, _, err = cli("verify", "run.zarr/qpos")

    assert code == 2
    assert "it is the array 'qpos' inside the archive at 'run.zarr'" in err
    assert "`flyarchive verify run.zarr`" in err


def test_a_path_inside_an_archive_on_s3_names_the_archive(archive, cli, s3_server):
    options = s3_server.storage_options()
    url = upload(archive, f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr", options)

    code, _, err = cli("verify", f"{url}/qpos", "--storage-options", json.dumps(options))

    assert code == 2
    assert f"it is the array 'qpos' inside the archive at {url!r}" in err


@pytest.mark.parametrize("command", ["info", "verify"])
@pytest.mark.parametrize("kind, reader", [("depth", "read_depth"),
                                          ("seg", "read_segmentation")])
def test_a_map_is_named_with_how_to_read_it_not_tampered(maps, cli, command, kind, reader):
    url = maps[kind]
    before = snapshot(url)

    code, out, err = cli(command, url)

    assert code == 2
    assert out == ""
    word = "depth" if kind == "depth" else "segmentation"
    assert f"No archive at {url!r}: it is a {word} map that `flyarchive render` wrote beside " \
           f"a video, not an archive. Read it with flyarchive.{reader}({url!r})" in err
    assert "tampered" not in err and "damaged" not in err
    assert snapshot(url) == before


def test_a_plain_zarr_array_is_not_an_archive(tmp_path):
    url = str(tmp_path / "plain.zarr")
    zarr.create_array(url, shape=(3,), dtype="f8", fill_value=0.0)[:] = 1.0
    before = snapshot(url)

    with pytest.raises(ArchiveNotFoundError, match="it is a zarr array, not a flyarchive archive"):
        open_archive(url)

    assert snapshot(url) == before



@pytest.mark.parametrize("command", [["set-world-var", "{url}", "x=1"],
                                     ["model", "attach", "{url}", "--model", "{model}"]],
                         ids=["set-world-var", "model attach"])
@pytest.mark.parametrize("where", ["missing", "file"])
def test_a_writer_pointed_at_no_archive_says_so_and_makes_nothing(tmp_path, cli, command, where):
    from flyarchive.testing import TINY_XML

    model = tmp_path / "fly.xml"
    model.write_text(TINY_XML)
    url = tmp_path / "deep" / "er" / "nope.zarr"
    if where == "file":
        url = tmp_path / "afile.txt"
        url.write_text("mine")
    before = sorted(p.name for p in tmp_path.iterdir())

    code, _, err = cli(*[part.format(url=url, model=model) for part in command])

    assert code == 2
    assert (f"Nothing at '{url}'" if where == "missing" else
            f"No archive at '{url}': it is a file, not an archive's folder") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert where == "missing" or url.read_text() == "mine"


def test_a_zarr_v2_store_is_said_to_be_one_not_damage(tmp_path, cli):
    import numpy as np
    import xarray as xr

    url = str(tmp_path / "v2.zarr")
    xr.Dataset({"a": ("x", np.arange(3))}).to_zarr(url, zarr_format=2)

    for command in ("info", "verify"):
        code, _, err = cli(command, url)
        assert code in (1, 2) and "is a zarr v2 store, not a flyarchive archive" in err + _
        assert "tampered" not in err + _
