"""The cache of model checks and compiled models: trusted only from a folder that only this
user can write, verdicts signed, the default folder made private; and the child process
that fills it, which runs with the caller's interpreter and import path (issue 32, items 7
and 8)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from flyarchive.errors import ModelLoadError, UntrustedCacheWarning
from flyarchive.lru import LRUCache
from flyarchive.models import check as model_check
from flyarchive.models import model_bytes, portable_model
from flyarchive.models.check import (
    check_model,
    child_path,
    compiled_model,
    compiled_path,
    trusted_cache,
    verdict_path,
)
from flyarchive.testing import write_meshed_model
from flyarchive.testing.fixtures import record, snapshot
from flyarchive.testing.model_fuzz import crafted, put_model

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def children(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Nothing known in this process, no folder warned about (as in a new process); the
    models a child process checked (real checks)."""
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(model_check.MAX_VERDICTS_HERE))
    monkeypatch.setattr(model_check, "_COMPILED", LRUCache(model_check.MAX_COMPILED_HERE))
    monkeypatch.setattr(model_check, "_WARNED", set())
    checked: list[str] = []
    real = model_check.run_child

    def counting(blob: bytes, sha256: str, *args, **kwargs):
        checked.append(sha256)
        return real(blob, sha256, *args, **kwargs)

    monkeypatch.setattr(model_check, "run_child", counting)
    return checked


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(model_check.MAX_VERDICTS_HERE))
    monkeypatch.setattr(model_check, "_COMPILED", LRUCache(model_check.MAX_COMPILED_HERE))


def _sign(folder: Path, fields: dict) -> dict:
    """``fields`` signed with the key kept in ``folder``, as flyarchive signs a verdict."""
    key = (folder / model_check.KEY_NAME).read_bytes()
    return {**fields, "mac": model_check._signature(key, fields)}


def _plant_ok(folder: Path, blob: bytes) -> Path:
    """A verdict "ok" for ``blob``, signed with the folder's own key: what someone who can
    write the folder (and read its key) could plant."""
    digest = hashlib.sha256(blob).hexdigest()
    fields = {"sha256": digest, "loader": model_check.loader(), "verdict": "ok", "stage": None,
              "what": "", "seconds": 0.1, "check": model_check.CHECK_VERSION, "compiled": None}
    path = verdict_path(digest, folder)
    path.write_text(json.dumps(_sign(folder, fields)))
    return path


@pytest.fixture
def keyed(tiny, tmp_path: Path) -> Path:
    """A cache folder with its key and the tiny model's verdict, made by a real check."""
    folder = tmp_path / "cache"
    check_model(model_bytes(tiny), "tiny.mjb", cache=folder)
    return folder


# ----------------------------------------------------------------------------- trust
def test_a_verdict_planted_in_a_folder_others_can_write_is_not_trusted(keyed, children):
    blob = crafted("fatal")
    _plant_ok(keyed, blob)
    keyed.chmod(0o777)

    with pytest.warns(UntrustedCacheWarning, match=r"can be written by its group or others "
                                                   r"\(mode 777\).*chmod 700"):
        with pytest.raises(ModelLoadError, match="crafted.mjb"):  # 3.16: unsafe; 4.0.1: refused
            check_model(blob, "crafted.mjb", cache=keyed)

    assert children[-1] == hashlib.sha256(blob).hexdigest()
    assert json.loads(verdict_path(hashlib.sha256(blob).hexdigest(), keyed).read_text())[
        "verdict"] == "ok"  # not read, not replaced: the folder is not written either


def test_the_planted_verdict_of_these_tests_would_be_used_from_a_private_folder(keyed, children):
    """The control of the tests around it: what they plant is a verdict this user could
    have written (signed with the folder's key), so that only the folder's trust differs."""
    blob = crafted("fatal")
    _plant_ok(keyed, blob)

    verdict = check_model(blob, "crafted.mjb", cache=keyed)

    assert verdict.verdict == "ok" and hashlib.sha256(blob).hexdigest() not in children


def test_a_cache_folder_of_another_user_is_not_trusted(keyed, monkeypatch, children):
    blob = crafted("fatal")
    _plant_ok(keyed, blob)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(keyed).st_uid + 1)

    with pytest.warns(UntrustedCacheWarning, match="belongs to another user"):
        with pytest.raises(ModelLoadError, match="crafted.mjb"):
            check_model(blob, "crafted.mjb", cache=keyed)

    assert children[-1] == hashlib.sha256(blob).hexdigest()


@pytest.mark.parametrize("edit", [
    lambda v: {**v, "verdict": "ok", "stage": None, "what": ""},
    lambda v: {k: v[k] for k in v if k != "mac"} | {"verdict": "ok", "stage": None, "what": ""},
], ids=["signature kept", "signature removed"])
def test_an_edited_verdict_is_not_trusted(keyed, monkeypatch, children, edit):
    blob = crafted("fatal")
    with pytest.raises(ModelLoadError):
        check_model(blob, "crafted.mjb", cache=keyed)
    path = verdict_path(hashlib.sha256(blob).hexdigest(), keyed)
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    _forget(monkeypatch)

    with pytest.raises(ModelLoadError, match="crafted.mjb"):
        check_model(blob, "crafted.mjb", cache=keyed)

    assert children[-2:] == [hashlib.sha256(blob).hexdigest()] * 2


def test_a_verdict_from_another_cache_is_not_trusted(keyed, tiny, tmp_path, monkeypatch):
    other = tmp_path / "other"
    check_model(model_bytes(tiny), "tiny.mjb", cache=other)  # another key
    blob = crafted("fatal")
    _plant_ok(other, blob)
    digest = hashlib.sha256(blob).hexdigest()
    verdict_path(digest, keyed).write_bytes(verdict_path(digest, other).read_bytes())
    _forget(monkeypatch)

    with pytest.raises(ModelLoadError, match="crafted.mjb"):
        check_model(blob, "crafted.mjb", cache=keyed)


def test_a_verdict_file_others_can_write_is_not_trusted(keyed, children):
    blob = crafted("fatal")
    path = _plant_ok(keyed, blob)
    path.chmod(0o666)

    with pytest.raises(ModelLoadError, match="crafted.mjb"):
        check_model(blob, "crafted.mjb", cache=keyed)

    assert children[-1] == hashlib.sha256(blob).hexdigest()


def test_a_render_beside_a_planted_verdict_does_not_crash_and_verify_reports_it(
        tiny, tmp_path, monkeypatch):
    from flyarchive import render_frames, verify

    cache = tmp_path / "cache"
    monkeypatch.setenv("FLYARCHIVE_CACHE_DIR", str(cache))
    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=8)
    check_model(model_bytes(tiny), "tiny.mjb")  # the folder, its key
    put_model(url, crafted("segfault"))
    _plant_ok(cache, crafted("segfault"))
    cache.chmod(0o775)
    before = snapshot(url)

    with pytest.warns(UntrustedCacheWarning):
        with pytest.raises(ModelLoadError, match="Pass --model"):  # 3.16: SIGSEGV, 4.0.1: refused
            render_frames(url, None, "front", size=(48, 64))
        report = verify(url)

    assert not report.ok and any(p.startswith("Model: ") for p in report.problems)
    assert snapshot(url) == before


def test_the_default_cache_folder_is_made_private(tiny, tmp_path, monkeypatch):
    monkeypatch.delenv("FLYARCHIVE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    check_model(model_bytes(tiny), "tiny.mjb")

    folder = tmp_path / "xdg" / "flyarchive"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / model_check.KEY_NAME).stat().st_mode) == 0o600
    assert trusted_cache() == folder


def test_verdicts_are_kept_by_hash_loader_and_check_version(tiny, tmp_path):
    blob = model_bytes(tiny)
    digest = hashlib.sha256(blob).hexdigest()

    check_model(blob, "tiny.mjb", cache=tmp_path)

    expected = f"{digest}.{model_check.loader()}.c{model_check.CHECK_VERSION}.json"
    assert verdict_path(digest, tmp_path).name == expected
    assert verdict_path(digest, tmp_path).is_file()


# ----------------------------------------------------------------------------- compiled models
@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory):
    return portable_model(write_meshed_model(tmp_path_factory.mktemp("meshed")))


def test_a_compiled_model_is_kept_and_used_by_the_next_process(portable, tmp_path, monkeypatch):
    first, _ = compiled_model(lambda: portable.blob, portable.sha256, "fly.mjz", cache=tmp_path)
    _forget(monkeypatch)
    monkeypatch.setattr(model_check, "compile_in_child", lambda *a: pytest.fail("compiled again"))

    again, verdict = compiled_model(lambda: pytest.fail("read again"), portable.sha256,
                                    "fly.mjz", cache=tmp_path)

    assert again == first == compiled_path(portable.sha256, tmp_path).read_bytes()
    assert verdict.compiled == hashlib.sha256(first).hexdigest()
    assert stat.S_IMODE(compiled_path(portable.sha256, tmp_path).stat().st_mode) == 0o600


def test_a_compiled_model_swapped_in_the_cache_is_not_used(portable, tiny, tmp_path, monkeypatch):
    first, _ = compiled_model(lambda: portable.blob, portable.sha256, "fly.mjz", cache=tmp_path)
    compiled_path(portable.sha256, tmp_path).write_bytes(model_bytes(tiny))
    _forget(monkeypatch)

    again, _ = compiled_model(lambda: portable.blob, portable.sha256, "fly.mjz", cache=tmp_path)

    assert again == first != model_bytes(tiny)


# ----------------------------------------------------------------------------- the child
def test_the_child_gets_the_import_path_without_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), "relative/lib", *sys.path])

    path = child_path()

    assert "" not in path and str(tmp_path) not in path
    assert str(tmp_path / "relative" / "lib") in path and all(os.path.isabs(p) for p in path)


@pytest.mark.subprocess
def test_the_check_runs_where_mujoco_comes_from_pythonpath(tiny, tmp_path):
    """A Python whose packages come from PYTHONPATH only (the GPU machine's setup): a
    virtual environment with nothing installed, MuJoCo and flyarchive on PYTHONPATH."""
    import mujoco

    import flyarchive

    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=8)
    venv.create(tmp_path / "bare", with_pip=False)
    packages = str(Path(mujoco.__file__).parents[1])
    here = str(Path(flyarchive.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, packages]),
           "FLYARCHIVE_CACHE_DIR": str(tmp_path / "cache")}

    done = subprocess.run(
        [str(tmp_path / "bare" / "bin" / "python"), "-c",
         f"import flyarchive; print(flyarchive.load_kept_model({url!r}).nq)"],
        capture_output=True, text=True, env=env, cwd=tmp_path / "bare", timeout=120)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(tiny.nq)
