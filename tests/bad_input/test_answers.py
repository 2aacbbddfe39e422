"""Bad input to the answers flyarchive gives back: ``.npz`` files whose schedule fields
(written by ``export_npz`` beside flygym's) are damaged, appends (``mode="a"``) with
another codec or dtype than stored, and claims left by crashed writers (``--takeover``).
Each case fails with a clear error and leaves what was committed as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.clock import Timing
from flyarchive.errors import NpzFormatError, SchemaError
from flyarchive.interop.flygym_npz import import_npz
from flyarchive.interop.npz_export import export_npz
from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveSpec, ArchiveWriter
from flyarchive.store.claims import WRITER_KEY, _identity
from flyarchive.testing import TINY_XML, simulate
from flyarchive.testing.fixtures import snapshot


# ----------------------------------------------------------------------------- npz schedules
@pytest.mark.parametrize(("fields", "fragment"), [
    ({"scheduled_time": None}, "scheduled_time and frame must come together"),
    ({"frame": np.array([1.5, 2.5])}, r"frame \(n,\) whole numbers with n=2"),
    ({"scheduled_time": np.array([0.0, np.nan])}, "must be finite and strictly increasing"),
    ({"scheduled_time": np.array([0.1, 0.0])}, "must be finite and strictly increasing"),
    ({"frame": np.array([-2, 1])}, "at least -1"),
])
def test_a_file_with_a_damaged_schedule_is_refused_and_imports_nothing(tiny, tmp_path, fields,
                                                                     fragment):
    arrays = {"time": np.array([0.002, 0.008]), "qpos": np.zeros((2, tiny.nq)),
              "output_fps": np.asarray(25), "playback_speed": np.asarray(0.2),
              "world_id": np.asarray(0), "scheduled_time": np.array([0.0, 0.008]),
              "frame": np.array([0, 1])}
    for key, value in fields.items():
        if value is None:
            arrays.pop("frame")
        else:
            arrays[key] = value
    np.savez(tmp_path / "w.npz", **arrays)

    before = snapshot(tmp_path)

    with pytest.raises(NpzFormatError, match=fragment):
        import_npz(tmp_path / "w.npz", str(tmp_path / "run.zarr"), tiny)

    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------- appends
def test_append_with_another_codec_is_refused_and_keeps_the_archive(tiny, archive):
    before = snapshot(archive)
    recorder = TrajectoryRecorder(archive, tiny, chunk_frames=5, mode="a", codec="abs:1e-6")

    with pytest.raises(SchemaError, match=r"stores its state with codec 'lossless'; appending "
                                          r"asks for codec 'abs:1e-6'\. One archive keeps one "
                                          r"codec .* Pass codec='lossless'"):
        simulate(tiny, 2, 90, recorder.record_as_needed)

    assert snapshot(archive) == before


def test_append_with_another_dtype_is_refused_and_keeps_the_archive(tiny, archive):
    before = snapshot(archive)
    recorder = TrajectoryRecorder(archive, tiny, chunk_frames=5, mode="a", dtype="float32")

    with pytest.raises(SchemaError, match=r"stores its state as float64; appending asks for "
                                          r"float32\. .* Pass dtype='float64'"):
        simulate(tiny, 2, 90, recorder.record_as_needed)

    assert snapshot(archive) == before


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"codec": "portable"}, r"codec 'lossless'; appending asks for codec 'portable'"),
    ({"dtype": "float32"}, r"as float64; appending asks for float32"),
])
def test_a_writer_appending_with_another_codec_or_dtype_is_refused(tiny, archive, changes,
                                                                   fragment):
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2), (0, 1),
                       chunk_frames=5, **changes)
    before = snapshot(archive)

    with pytest.raises(SchemaError, match=fragment):
        ArchiveWriter.create(archive, spec, mode="a")

    assert snapshot(archive) == before


def test_a_world_block_writer_with_another_codec_is_refused(tiny, tmp_path):
    url = str(tmp_path / "shared.zarr")
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2),
                       (0, 1, 2, 3), chunk_frames=5, shard_worlds=2, capacity_frames=40,
                       codec="portable")
    ArchiveWriter.create(url, spec).close()
    before = snapshot(url)
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a", world_ids=[0, 1],
                                  world_block=(0, 2))

    with pytest.raises(SchemaError, match=r"codec 'portable'; appending asks for codec 'lossless'"):
        simulate(tiny, 2, 8, recorder.record_as_needed)

    assert snapshot(url) == before


def test_resuming_an_import_with_another_codec_is_refused(tiny, archive, tmp_path, cli):
    export_npz(archive, tmp_path / "npz")

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    url = str(tmp_path / "imported.zarr")
    with pytest.raises(KeyboardInterrupt):
        import_npz(tmp_path / "npz", url, tiny, chunk_frames=5, codec="abs:1e-6",
                   progress=interrupt)
    (tmp_path / "tiny.xml").write_text(TINY_XML)
    before = snapshot(url)

    code, _, err = cli("import-npz", tmp_path / "npz", "--to", url, "--model",
                       tmp_path / "tiny.xml", "--resume")

    assert code == 2 and err.count("\n") == 1
    assert "codec 'abs:1e-6'; appending asks for codec 'lossless'" in err
    assert "Pass codec='abs:1e-6' (--codec abs:1e-6) to append to it" in err
    assert snapshot(url) == before


# ----------------------------------------------------------------------------- --takeover
def plant_claim(url: str) -> None:
    """The writer claim a writer that crashed on another host leaves."""
    record = {"writer": "planted", "kind": "archive", **_identity(), "time": 1.7e9,
              "host": "node-17", "pid": 4242}
    (Path(url) / WRITER_KEY).write_text(json.dumps(record))


def test_set_world_var_on_a_claimed_archive_names_the_takeover_flag(archive, cli):
    plant_claim(archive)
    before = snapshot(archive)

    code, _, err = cli("set-world-var", archive, "success=1,0")

    assert code == 2 and err.count("\n") == 1
    assert "process 4242 on host 'node-17'" in err
    assert "pass takeover=True (--takeover on the command line)" in err
    assert snapshot(archive) == before


def test_set_world_var_with_takeover_takes_a_crashed_writers_claim(archive, cli):
    plant_claim(archive)

    code, out, err = cli("set-world-var", archive, "success=1,0", "--takeover")

    assert code == 0, err
    assert "set success" in out
    assert open_archive(archive).success.values.tolist() == [1, 0]


def test_import_resume_with_takeover_finishes_an_import_a_crashed_writer_held(tiny, archive,
                                                                              tmp_path, cli):
    export_npz(archive, tmp_path / "npz")
    url = str(tmp_path / "imported.zarr")

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_npz(tmp_path / "npz", url, tiny, chunk_frames=5, progress=interrupt)
    plant_claim(url)
    (tmp_path / "tiny.xml").write_text(TINY_XML)
    argv = ("import-npz", tmp_path / "npz", "--to", url, "--model", tmp_path / "tiny.xml",
            "--resume")
    before = snapshot(url)

    refused = cli(*argv)
    after_refusal = snapshot(url)
    done = cli(*argv, "--takeover")

    assert refused[0] == 2 and "(--takeover on the command line)" in refused[2]
    assert after_refusal == before
    assert done[0] == 0, done[2]
    np.testing.assert_array_equal(open_archive(url).qpos.values, open_archive(archive).qpos.values)
