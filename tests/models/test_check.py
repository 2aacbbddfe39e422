"""The check of kept models (a child process loads them first) and its verdicts, kept by
hash and loader in the cache folder. Loading a kept model or a model file:
tests/models/test_load.py; bad models themselves: tests/bad_input/test_model_check.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import mujoco
import pytest

import flyarchive
from flyarchive import config
from flyarchive.errors import ModelLoadError
from flyarchive.lru import LRUCache
from flyarchive.models import check as model_check
from flyarchive.models import model_bytes
from flyarchive.models.check import check_model, verdict_path
from flyarchive.testing.fixtures import record

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny archive, recorded once: tests only read it."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("model-check") / "run.zarr"))


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """No verdict known in this process (as in a new one); the blobs a child process is
    started for (real ones)."""
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(model_check.MAX_VERDICTS_HERE))
    runs: list[bytes] = []
    real = model_check.run_child

    def counting(blob: bytes, *args, **kwargs):
        runs.append(blob)
        return real(blob, *args, **kwargs)

    monkeypatch.setattr(model_check, "run_child", counting)
    return runs


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """As :func:`fresh`, but the child's verdict is "ok" at once, without a process: for
    tests of the verdicts' keeping, not of the check."""
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(model_check.MAX_VERDICTS_HERE))
    runs: list[bytes] = []

    def judge(blob: bytes, sha256: str, *args, **kwargs):
        runs.append(blob)
        return model_check.Verdict(sha256, model_check.loader(), "ok", seconds=0.0)

    monkeypatch.setattr(model_check, "run_child", judge)
    return runs


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(model_check.MAX_VERDICTS_HERE))


# ----------------------------------------------------------------------------- verdicts
def test_a_verdict_is_kept_with_the_loader_and_used_by_the_next_process(tiny, tmp_path, fresh,
                                                                         monkeypatch):
    blob = model_bytes(tiny)
    digest = hashlib.sha256(blob).hexdigest()

    check_model(blob, "tiny.mjb", cache=tmp_path)
    _forget(monkeypatch)
    again = check_model(blob, "tiny.mjb", cache=tmp_path)

    kept = json.loads(verdict_path(digest, tmp_path).read_text())
    assert len(fresh) == 1 and again.verdict == "ok"
    assert kept["sha256"] == digest and kept["verdict"] == "ok"
    assert mujoco.__version__ in kept["loader"] and kept["loader"] in verdict_path(digest).name
    assert [p.name for p in verdict_path(digest, tmp_path).parent.iterdir()] == \
        [verdict_path(digest, tmp_path).name]  # no temporary file left


@pytest.mark.parametrize("edit", [
    lambda v: {**v, "loader": "mujoco-3.15.0-x86_64"},
    lambda v: {**v, "check": 0},
    lambda v: {**v, "sha256": "0" * 64},
    lambda v: {**v, "verdict": "fine"},
    lambda v: [v],
], ids=["another loader", "another check", "another model", "unknown verdict", "not an object"])
def test_a_kept_verdict_that_does_not_fit_is_not_used(tiny, tmp_path, judged, monkeypatch, edit):
    blob = model_bytes(tiny)
    path = verdict_path(hashlib.sha256(blob).hexdigest(), tmp_path)
    check_model(blob, "tiny.mjb", cache=tmp_path)
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    _forget(monkeypatch)

    check_model(blob, "tiny.mjb", cache=tmp_path)

    assert len(judged) == 2 and json.loads(path.read_text())["check"] == model_check.CHECK_VERSION


@pytest.mark.parametrize("plant", ["garbage", "fifo", "link"])
def test_a_verdict_file_that_is_not_a_small_regular_file_is_not_read(tiny, tmp_path, judged, plant):
    blob = model_bytes(tiny)
    path = verdict_path(hashlib.sha256(blob).hexdigest(), tmp_path)
    path.parent.mkdir(parents=True)
    if plant == "garbage":
        path.write_bytes(b"\x00{" * 100)
    elif plant == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere.json").write_text(json.dumps({"verdict": "ok"}))
        path.symlink_to(tmp_path / "elsewhere.json")

    verdict = check_model(blob, "tiny.mjb", cache=tmp_path)

    assert verdict.verdict == "ok" and len(judged) == 1


def test_a_cache_that_cannot_be_written_only_means_checking_each_time(tiny, tmp_path, judged,
                                                                      monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    blob = model_bytes(tiny)

    first = check_model(blob, "tiny.mjb", cache=blocked)
    _forget(monkeypatch)
    second = check_model(blob, "tiny.mjb", cache=blocked)

    assert first.verdict == second.verdict == "ok" and len(judged) == 2
    assert blocked.read_text() == "not a folder"


def test_the_cache_folder_follows_flyarchive_cache_dir_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("FLYARCHIVE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    mine = config.cache_folder()
    monkeypatch.delenv("FLYARCHIVE_CACHE_DIR")
    xdg = config.cache_folder()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored (XDG spec)
    home = config.cache_folder()

    assert mine == tmp_path / "mine" and xdg == tmp_path / "xdg" / "flyarchive"
    assert home == Path("~/.cache/flyarchive").expanduser()


def test_load_kept_model_checks_a_kept_model_once_per_loader(tiny, archive, fresh, monkeypatch,
                                                            model_check_cache):
    digest = hashlib.sha256(model_bytes(tiny)).hexdigest()
    flyarchive.load_kept_model(archive)
    first = len(fresh)  # 0 when an earlier test of the session checked the tiny model
    _forget(monkeypatch)

    flyarchive.load_kept_model(archive)

    assert len(fresh) == first <= 1
    assert verdict_path(digest) == verdict_path(digest, model_check_cache / "")
    assert verdict_path(digest).is_file()


def test_a_check_whose_process_cannot_begin_is_an_error_of_its_own_and_not_kept(
        tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(model_check.MAX_VERDICTS_HERE))
    monkeypatch.setattr(model_check, "_CHILD", tmp_path / "missing_child.py")  # python exits 2

    with pytest.raises(ModelLoadError, match=r"could not check the model .* in a child process: "
                                             r".* ended with status 2 before loading it") as caught:
        check_model(model_bytes(tiny), "tiny.mjb", cache=tmp_path / "cache")

    assert not isinstance(caught.value, model_check.UnsafeModelError)
    assert not (tmp_path / "cache").exists()
