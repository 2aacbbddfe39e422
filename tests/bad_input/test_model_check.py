"""Bad models: a kept model that crashes MuJoCo's loader, raises mujoco.FatalError or that
MuJoCo refuses, and model files of the user that MuJoCo cannot use. Each case is one
clear error (type, message fragment); this process never loads a kept model before a
child process did; nothing committed changes and no video is written.

The crafted models (flyarchive.testing.model_fuzz.CRAFTED) are the tiny model with one
field edited; what each MuJoCo release line does with each is named there (MuJoCo 4's
loader refuses the edit that makes 3.16 raise mujoco.FatalError). The tests check the
behaviour this release has: unsafe (a crash or a FatalError in the child, never in this
process) or refused cleanly, with MuJoCo's reason.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from flyarchive import load_kept_model, load_model_file
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.distribute.frames import render_frames
from flyarchive.errors import ModelLoadError, UnsafeModelError
from flyarchive.models.check import check_model, verdict_path
from flyarchive.testing.fixtures import snapshot
from flyarchive.testing.model_fuzz import crafted, crafted_model, crafted_outcome, put_model

pytestmark = pytest.mark.timeout(120)

SMALL = RenderOptions(size=(48, 64), segment_frames=8)
SEGFAULT = r"making the model's MjData crashed with SIGSEGV"
FATAL = r"making the model's MjData raised mujoco\.FatalError: checkDBSparse"
TRUST = r"Pass --model to use a model you trust \(API: model=\.\.\.\)"
#: What the error says for each outcome of :func:`crafted_outcome`.
SAYS = {"SIGSEGV": SEGFAULT, "FatalError": FATAL, "refused": r"could not load .*out of bounds"}


def assert_refused(error: BaseException, path: Path, outcome: str) -> None:
    """``error`` is the kept model's refusal for ``outcome``: it names the file, what MuJoCo
    did and the way out; an unsafe model is an UnsafeModelError, a refused one is not."""
    assert isinstance(error, ModelLoadError) and str(path) in str(error)
    assert re.search(SAYS[outcome], str(error)) and re.search(TRUST, str(error))
    if outcome == "refused":
        assert not isinstance(error, UnsafeModelError)
    else:
        assert isinstance(error, UnsafeModelError)
        assert f"The model {str(path)!r} is not safe to load" in str(error)
        assert "did not load it into this process" in str(error)


def _render(url: str, out: Path) -> Any:
    return render_videos(url, None, "front", str(out), options=SMALL, n_workers=0)


def _frames(url: str, out: Path) -> Any:
    return render_frames(url, None, "front", size=(48, 64))


def _load(url: str, out: Path) -> Any:
    return load_kept_model(url)


def _positions(url: str, out: Path) -> Any:
    from flyarchive import positions

    return positions(url, bodies=["torso"])


@pytest.mark.parametrize("call", [_render, _frames, _load, _positions],
                         ids=["render_videos", "render_frames", "load_kept_model", "positions"])
@pytest.mark.parametrize("name", ["segfault", "fatal"])
def test_a_kept_model_that_is_not_safe_to_load_is_refused_naming_the_file(
        archive, tmp_path, call, name):
    path = put_model(archive, crafted(name))
    before = snapshot(archive)

    with pytest.raises(ModelLoadError) as caught:
        call(archive, tmp_path / "videos")

    assert_refused(caught.value, path, crafted_outcome(name))
    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_cli_render_of_a_kept_model_that_crashes_the_loader_is_one_line(archive, tmp_path, cli):
    path = put_model(archive, crafted("segfault"))
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--camera", "front", "--out", tmp_path / "videos",
                       "--workers", "0", "--quiet")

    assert code == 2 and err.startswith("flyarchive render: error: ") and err.count("\n") == 1
    assert str(path) in err and "crashed with SIGSEGV" in err and "Pass --model" in err
    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


@pytest.mark.parametrize("name", ["segfault", "fatal"])
def test_verify_reports_a_kept_model_that_is_not_safe_to_load(archive, cli, name):
    put_model(archive, crafted(name))
    before = snapshot(archive)

    code, out, err = cli("verify", archive)

    assert code == 1 and out == "" and err.startswith(f"FAILED: {archive}")
    assert "  - Model: " in err and re.search(SAYS[crafted_outcome(name)], err)
    assert snapshot(archive) == before


def test_verify_reports_kept_bytes_that_are_no_mjb_even_named_by_their_own_hash(archive, cli):
    noise = bytes(range(256)) * 80  # hashes to its name: only the bytes are wrong
    path = put_model(archive, noise)
    before = snapshot(archive)

    code, _, err = cli("verify", archive)

    assert code == 1 and err.startswith(f"FAILED: {archive}")
    assert f"  - Model: {path} is not a compiled MuJoCo model (.mjb)" in err
    assert snapshot(archive) == before


def test_a_kept_model_the_loader_refuses_is_a_model_load_error_with_its_reason(archive, tmp_path):
    path = put_model(archive, crafted("refused"))
    before = snapshot(archive)

    with pytest.raises(ModelLoadError, match="body_parentid out of bounds") as caught:
        _render(archive, tmp_path / "videos")

    assert not isinstance(caught.value, UnsafeModelError)
    assert str(path) in str(caught.value) and caught.match(TRUST)
    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_a_check_that_does_not_finish_is_refused_and_its_verdict_not_kept(tiny, tmp_path):
    from flyarchive.models import model_bytes

    blob = model_bytes(tiny)

    with pytest.raises(UnsafeModelError, match=r"did not finish within 0\.001 s \(killed\)"):
        check_model(blob, "slow.mjb", cache=tmp_path, timeout_s=0.001)

    assert not list(tmp_path.rglob("*.json"))


def test_an_unsafe_verdict_is_kept_and_refused_again_without_a_child(archive, tmp_path,
                                                                     monkeypatch):
    import hashlib

    from flyarchive.lru import LRUCache
    from flyarchive.models import check as model_check

    blob = crafted("segfault")  # unsafe on every release line
    with pytest.raises(UnsafeModelError):
        check_model(blob, "segfault.mjb", cache=tmp_path)
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(8))  # as in another process
    monkeypatch.setattr(model_check, "run_child", lambda *a, **k: pytest.fail("checked again"))

    with pytest.raises(UnsafeModelError, match=SEGFAULT):
        check_model(blob, "segfault.mjb", cache=tmp_path)

    assert verdict_path(hashlib.sha256(blob).hexdigest(), tmp_path).is_file()


# ----------------------------------------------------------------------------- the user's models
#: What loading the user's own MJB of ``CRAFTED["fatal"]`` says, by outcome.
USER_FILE_SAYS = {"FatalError": "making its MjData raised FatalError: checkDBSparse",
                  "refused": "D_rownnz out of bounds"}


def test_a_model_file_whose_data_raises_a_fatal_error_is_a_model_load_error(tmp_path):
    path = tmp_path / "fatal.mjb"
    path.write_bytes(crafted("fatal"))

    with pytest.raises(ModelLoadError) as caught:
        load_model_file(path)

    assert str(path) in str(caught.value)
    assert USER_FILE_SAYS[crafted_outcome("fatal")] in str(caught.value)


def test_cli_render_with_a_model_file_whose_data_raises_a_fatal_error_is_one_line(
        archive, tmp_path, cli):
    path = tmp_path / "fatal.mjb"
    path.write_bytes(crafted("fatal"))
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--model", path, "--camera", "front",
                       "--out", tmp_path / "videos", "--workers", "0")

    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert str(path) in err and USER_FILE_SAYS[crafted_outcome("fatal")] in err
    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_a_model_object_whose_data_raises_a_fatal_error_is_refused_by_render(archive, tmp_path):
    model = crafted_model("fatal")  # never loaded: MuJoCo's checks come with MjData
    before = snapshot(archive)

    with pytest.raises(ModelLoadError, match="MuJoCo cannot use the model: making its MjData "
                                             "raised FatalError"):
        render_videos(archive, model, "front", str(tmp_path / "videos"), options=SMALL,
                      n_workers=0)

    assert snapshot(archive) == before and not (tmp_path / "videos").exists()
