"""flyarchive's environment variables (flyarchive.config): each read in one place, a bad
value refused naming the variable, its value and what is allowed, before any work."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import flyarchive
from flyarchive import config
from flyarchive.errors import ConfigError
from flyarchive.testing.fixtures import record, snapshot
from flyarchive.testing.markers import requires_warp

ROOT = Path(__file__).resolve().parents[2]
SIZE = (32, 48)  # (height, width)


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tiny world of 3 frames: the renders here are refused before any work."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("tiny") / "run.zarr"), n_worlds=1,
                  n_steps=12)


BAD_VALUES = [
    ("FLYARCHIVE_ENCODERS", "many", "whole number >= 0"),
    ("FLYARCHIVE_ENCODERS", "-1", "whole number >= 0"),
    ("FLYARCHIVE_BATCHES_IN_FLIGHT", "1", "whole number >= 2"),
    ("FLYARCHIVE_BATCHES_IN_FLIGHT", "4.5", "whole number >= 2"),
    ("FLYARCHIVE_CUDA_GRAPH", "sometimes", "a switch"),
    ("FLYARCHIVE_VERBOSE", "2", "a switch"),
    ("FLYARCHIVE_WORKER", "yes please", "a switch"),
    ("FLYARCHIVE_WARP_OPTIMIZATION", "4", "whole number from 0 to 3"),
    ("FLYARCHIVE_WARP_OPTIMIZATION", "-1", "whole number from 0 to 3"),
    ("FLYARCHIVE_WARP_OPTIMIZATION", "O2", "whole number from 0 to 3"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_VALUES)
def test_a_bad_value_is_refused_naming_the_variable_its_value_and_what_is_allowed(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str, allowed: str) -> None:
    monkeypatch.setenv(name, value)

    with pytest.raises(ConfigError) as caught:
        config.KNOBS[name].read()

    assert f"{name}={value!r}" in str(caught.value) and allowed in str(caught.value)


def test_config_errors_are_value_errors() -> None:
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, flyarchive.FlyarchiveError)


def test_unset_or_empty_variables_take_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in config.KNOBS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYARCHIVE_BATCHES_IN_FLIGHT", "  ")

    actual = (config.encoders(), config.batches_in_flight(), config.cuda_graph(),
              config.verbose(), config.is_worker(), config.warp_optimization())

    assert actual == (os.cpu_count() or 1, 4, True, False, False, None)


@pytest.mark.subprocess
@requires_warp
def test_warp_imported_by_flyarchive_compiles_at_the_level_the_variable_gives() -> None:
    import subprocess
    import sys

    code = ("from flyarchive.warp_log import import_warp; "
            "print(import_warp('a test').config.optimization_level)")
    env = {**os.environ, "FLYARCHIVE_WARP_OPTIMIZATION": "1"}

    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


@pytest.mark.parametrize(("value", "set_by_program", "expected"), [
    ("0", None, 0), ("3", None, 3), ("", None, None), ("0", 2, 2),
])
def test_warp_optimization_is_given_to_warp_unless_the_program_chose_one(
        monkeypatch: pytest.MonkeyPatch, value: str, set_by_program: int | None,
        expected: int | None) -> None:
    from types import SimpleNamespace

    from flyarchive.warp_log import set_optimization

    monkeypatch.setenv("FLYARCHIVE_WARP_OPTIMIZATION", value)
    warp_config = SimpleNamespace(optimization_level=set_by_program)

    set_optimization(warp_config)

    assert warp_config.optimization_level == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("1", True), ("TRUE", True), ("yes", True), ("On", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_switches_take_the_documented_spellings(monkeypatch: pytest.MonkeyPatch, text: str,
                                                expected: bool) -> None:
    monkeypatch.setenv("FLYARCHIVE_WORKER", text)

    assert config.is_worker() is expected


def test_worker_zero_means_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYARCHIVE_WORKER", "0")

    assert config.is_worker() is False


def test_set_verbose_is_read_back_by_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLYARCHIVE_VERBOSE", raising=False)

    config.set_verbose(True)
    on = config.verbose()
    config.set_verbose(False)

    assert (on, config.verbose()) == (True, False)


def test_no_module_reads_a_flyarchive_variable_around_config() -> None:
    readers = []
    for path in sorted((ROOT / "flyarchive").rglob("*.py")):
        if path.name == "config.py" or "testing" in path.parts:
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?[\[(]\s*[\"']FLYARCHIVE_", text) or \
                re.search(r"getenv\(\s*[\"']FLYARCHIVE_", text):
            readers.append(str(path.relative_to(ROOT)))

    assert readers == []


def test_the_readme_lists_every_variable() -> None:
    readme = (ROOT / "README.md").read_text()

    missing = [name for name in [*config.KNOBS, "MUJOCO_GL"] if f"`{name}`" not in readme]

    assert missing == []


def test_a_bad_variable_fails_a_render_before_any_work(
        monkeypatch: pytest.MonkeyPatch, tiny_archive: str, tmp_path: Path) -> None:
    from flyarchive.testing import tiny_model

    before = snapshot(Path(tiny_archive))
    monkeypatch.setenv("FLYARCHIVE_ENCODERS", "many")
    out = tmp_path / "videos"

    with pytest.raises(ConfigError, match="FLYARCHIVE_ENCODERS='many'"):
        flyarchive.render_videos(tiny_archive, tiny_model(), "front", str(out), n_workers=0,
                                 options=flyarchive.RenderOptions(size=SIZE))

    assert not out.exists()
    assert snapshot(Path(tiny_archive)) == before


def test_the_cli_reports_a_bad_variable_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_archive: str,
        tmp_path: Path) -> None:
    from flyarchive.cli import main
    from flyarchive.testing import tiny_model

    model = flyarchive.save_mjb(tiny_model(), tmp_path / "tiny.mjb")
    monkeypatch.setenv("FLYARCHIVE_BATCHES_IN_FLIGHT", "1")
    out = tmp_path / "videos"

    code = main(["render", tiny_archive, "--model", str(model), "--camera", "front",
                 "--size", "32x48", "--workers", "0", "--out", str(out), "--quiet"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("flyarchive render: error: The environment variable "
                          "FLYARCHIVE_BATCHES_IN_FLIGHT='1'") and err.count("\n") == 1
    assert not out.exists()


def test_the_cli_reports_an_option_error_in_one_line(
        capsys: pytest.CaptureFixture[str], tiny_archive: str, tmp_path: Path) -> None:
    from flyarchive.cli import main
    from flyarchive.testing import tiny_model

    model = flyarchive.save_mjb(tiny_model(), tmp_path / "tiny.mjb")
    out = tmp_path / "videos"

    code = main(["render", tiny_archive, "--model", str(model), "--camera", "front",
                 "--size", "32x48", "--workers", "-2", "--out", str(out)])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("flyarchive render: error: n_workers must be") and err.count("\n") == 1
    assert not out.exists()
