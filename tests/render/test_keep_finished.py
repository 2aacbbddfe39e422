"""Finished work is kept: a render stopped mid-way keeps its finished videos listed in the
manifest (the manifest journal), and ``resume=True`` / ``--resume`` keeps them untouched
and renders the rest. In this process (killed processes: tests/reliability/test_render_kill.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flyarchive import TrajectoryRecorder
from flyarchive.render import opengl_pipeline as opengl
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.testing import simulate
from flyarchive.testing.fixtures import copy_archive, record
from flyarchive.testing.markers import WARP_BACKEND, requires_warp
from flyarchive.video import read_video

pytestmark = pytest.mark.slow  # renders in every test: the full suite runs it, not the fast tier

SMALL = RenderOptions(size=(48, 64), segment_frames=4)
CAMERAS = ["front", "top"]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> str:
    """Worlds 3 and 7 of the tiny model, 11 frames each, recorded once: tests only read it."""
    from flyarchive.testing import tiny_model

    url = str(tmp_path_factory.mktemp("keep") / "tiny.zarr")
    return record(tiny_model(), url, world_ids=[3, 7], n_steps=40)


def stop_at_join(monkeypatch, n: int) -> None:
    """Ctrl-C (KeyboardInterrupt) when the render starts joining its ``n``-th video."""
    join, calls = opengl.join_segments, []

    def joining(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return join(*args, **kwargs)

    monkeypatch.setattr(opengl, "join_segments", joining)


def listed(out: Path) -> list[str]:
    return [v["path"] for v in json.loads((out / "manifest.json").read_text())["videos"]]


def identity(path: str) -> tuple[int, int, int]:
    st = Path(path).stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def interrupted(archive: str, tiny, out: Path, monkeypatch, n: int, **options) -> list[str]:
    """Render both cameras of both worlds, stopped at the ``n``-th join; the listed videos."""
    stop_at_join(monkeypatch, n)
    with pytest.raises(KeyboardInterrupt):
        render_videos(archive, tiny, CAMERAS, str(out), n_workers=0,
                      options=RenderOptions(**{"size": (48, 64), **options}))
    monkeypatch.undo()
    return listed(out)


def test_ctrl_c_keeps_the_finished_videos_listed_and_drops_the_rest(archive, tiny, tmp_path,
                                                                    monkeypatch):
    out = tmp_path / "v"

    done = interrupted(archive, tiny, out, monkeypatch, 3)

    assert done == [str(out / "world00003" / f"{c}.mp4") for c in CAMERAS]
    assert all(read_video(p).shape == (11, 48, 64, 3) for p in done)
    assert sorted(str(p) for p in out.rglob("*.mp4")) == sorted(done)
    assert not list(out.glob(".parts-*"))


def test_resume_keeps_the_finished_videos_untouched_and_renders_the_rest(archive, tiny,
                                                                        tmp_path, monkeypatch):
    out = tmp_path / "v"
    done = interrupted(archive, tiny, out, monkeypatch, 3)
    before = {p: identity(p) for p in done}

    result = render_videos(archive, tiny, CAMERAS, str(out), options=SMALL, n_workers=0,
                           resume=True)

    assert result.kept == 2 and {identity(p) for p in done} == set(before.values())
    expected = [str(out / f"world{w:05d}" / f"{c}.mp4") for w in (3, 7) for c in CAMERAS]
    assert [v["path"] for v in result.videos] == expected
    assert sorted(listed(out)) == sorted(expected)
    assert all(read_video(p).shape == (11, 48, 64, 3) for p in expected)


def test_resume_keeps_a_finished_camera_of_a_world_left_unfinished(archive, tiny, tmp_path,
                                                                  monkeypatch):
    out = tmp_path / "v"
    (front,) = interrupted(archive, tiny, out, monkeypatch, 2)
    before = identity(front)

    result = render_videos(archive, tiny, CAMERAS, str(out), options=SMALL, n_workers=0,
                           resume=True)

    assert result.kept == 1 and identity(front) == before
    assert len(listed(out)) == 4 and read_video(out / "world00003" / "top.mp4").shape[0] == 11


def test_resume_of_a_finished_render_renders_nothing(archive, tiny, tmp_path, monkeypatch):
    out = tmp_path / "v"
    first = render_videos(archive, tiny, CAMERAS, str(out), options=SMALL, n_workers=0)
    monkeypatch.setattr(opengl, "render_segment", lambda *a, **k: pytest.fail("rendered"))

    result = render_videos(archive, tiny, CAMERAS, str(out), options=SMALL, n_workers=0,
                           resume=True)

    assert result.kept == 4 and result.videos == json.loads(json.dumps(first.videos))


@pytest.mark.parametrize("change", ["size", "camera removed from the manifest", "file gone"])
def test_resume_renders_again_what_is_not_the_listed_finished_video(archive, tiny, tmp_path,
                                                                   change):
    out = tmp_path / "v"
    render_videos(archive, tiny, "front", str(out), options=SMALL, n_workers=0)
    video = out / "world00003" / "front.mp4"
    options = SMALL
    if change == "size":
        options = RenderOptions(size=(32, 48))
    elif change == "file gone":
        video.unlink()
    else:
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["videos"] = [v for v in manifest["videos"] if v["path"] != str(video)]
        (out / "manifest.json").write_text(json.dumps(manifest))

    result = render_videos(archive, tiny, "front", str(out), options=options, n_workers=0,
                           resume=True)

    again = [v for v in result.videos[result.kept:] if v["path"] == str(video)]
    assert len(again) == 1 and read_video(video).shape[1:3] == tuple(options.size)
    assert result.kept == (0 if change == "size" else 1)


def test_resume_renders_everything_again_for_an_archive_replaced_at_the_same_url(
        archive, tiny, tmp_path):
    url, out = copy_archive(archive, tmp_path / "tiny.zarr"), tmp_path / "v"
    render_videos(url, tiny, "front", str(out), options=SMALL, n_workers=0)
    with TrajectoryRecorder(url, tiny, chunk_frames=5, world_ids=[3, 7], mode="w") as recorder:
        simulate(tiny, 2, 40, recorder.record_as_needed)  # a new archive_id

    result = render_videos(url, tiny, "front", str(out), options=SMALL, n_workers=0,
                           resume=True)

    assert result.kept == 0 and len(result.videos) == 2


def test_cli_resume_says_what_it_kept(archive, tiny, tmp_path, monkeypatch, cli, model_xml):
    out = tmp_path / "v"
    interrupted(archive, tiny, out, monkeypatch, 3)

    code, said, err = cli("render", archive, "--model", model_xml, "--camera", "front",
                          "--camera", "top", "--size", "48x64", "--out", out, "--workers", "0",
                          "--quiet", "--resume")

    assert code == 0, err
    assert said.startswith("wrote 2 video(s), kept 2 finished before and ")


# ----------------------------------------------------------------------------- the journal
def test_the_manifest_journal_lists_the_first_video_at_once_and_the_rest_on_close(
        archive, tiny, tmp_path):
    from flyarchive.render.plan import RenderPlan
    from flyarchive.store.dataset import open_header
    from flyarchive.query.selection import select_frames
    from flyarchive.video.manifest import ManifestJournal, video_entry

    ds = open_header(archive)
    jobs = tuple(select_frames(ds, None, None))
    out = tmp_path / "v"
    plan = RenderPlan(url=archive, storage_options={}, cameras=("front",), out=str(out),
                      out_storage_options={}, fps=25.0, options=SMALL, jobs=jobs)
    out.mkdir()
    entries = [video_entry(plan, job, "front", plan.output_urls(job, "front")) for job in jobs]
    journal = ManifestJournal(plan, ds, every_s=3600)

    journal.add(entries[0])
    deadline = time.monotonic() + 30
    while not (out / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the journal's thread writes it: wait for the file
    first = listed(out)
    journal.add(entries[1])
    journal.close()

    assert first == [entries[0]["path"]]
    assert listed(out) == [e["path"] for e in entries]


@requires_warp
def test_a_warp_render_lists_each_video_as_it_is_published(archive, tiny, tmp_path, monkeypatch):
    from flyarchive.video import manifest

    seen, add = [], manifest.ManifestJournal.add
    monkeypatch.setattr(manifest.ManifestJournal, "add",
                        lambda self, video: (seen.append(video["path"]), add(self, video))[1])

    result = render_videos(archive, tiny, CAMERAS, str(tmp_path / "v"), n_workers=0,
                           options=RenderOptions(size=(32, 48), backend=WARP_BACKEND))

    assert sorted(seen) == sorted(v["path"] for v in result.videos) and len(seen) == 4


def test_resume_keeps_the_videos_of_the_same_archive_named_otherwise(archive, tiny, tmp_path,
                                                                     monkeypatch):
    out, link = tmp_path / "v", tmp_path / "link"
    link.symlink_to(Path(archive).parent)
    render_videos(archive, tiny, "front", str(out), options=SMALL, n_workers=0)
    monkeypatch.setattr(opengl, "render_segment", lambda *a, **k: pytest.fail("rendered"))

    for name in (f"file://{archive}", str(link / Path(archive).name)):
        result = render_videos(name, tiny, "front", str(out), options=SMALL, n_workers=0,
                               resume=True)
        assert result.kept == 2  # the same archive_id: its finished videos kept


def test_resume_into_a_folder_of_another_archives_render_is_refused(archive, tiny, tmp_path):
    from flyarchive.errors import OutputExistsError

    other = record(tiny, str(tmp_path / "other.zarr"), world_ids=[3, 7], n_steps=40)
    out = tmp_path / "v"
    render_videos(archive, tiny, "front", str(out), options=SMALL, n_workers=0)
    before = {p: identity(str(p)) for p in out.rglob("*.mp4")}

    with pytest.raises(OutputExistsError, match="holds the videos of a render of another "
                                                "archive .*--resume would replace them"):
        render_videos(other, tiny, "front", str(out), options=SMALL, n_workers=0, resume=True)

    assert {p: identity(str(p)) for p in out.rglob("*.mp4")} == before


def test_resume_renders_again_the_videos_of_another_model(archive, tiny, tmp_path):
    """The same archive rendered with another model (a recoloured one): its videos are
    not what this render would make."""
    import hashlib

    from flyarchive.models import model_bytes
    from flyarchive.testing import tiny_model

    out = tmp_path / "v"
    render_videos(archive, tiny, "front", str(out), options=SMALL, n_workers=0)
    other = tiny_model()
    other.geom_rgba[:, 0] = 1.0 - other.geom_rgba[:, 0]

    again = render_videos(archive, other, "front", str(out), options=SMALL, n_workers=0,
                          resume=True)
    same = render_videos(archive, other, "front", str(out), options=SMALL, n_workers=0,
                         resume=True)

    assert again.kept == 0 and len(again.videos) == 2
    assert same.kept == 2
    assert {v["model_sha256"] for v in same.videos} == {hashlib.sha256(model_bytes(other)).hexdigest()}
