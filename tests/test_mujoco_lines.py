"""The MuJoCo lines flyarchive supports are the ones it tests: pyproject's bounds admit the
releases scripts/dev.sh installs (MuJoCo 3.16 with flygym; MuJoCo 4.0.1 with mujoco-warp
4.0.0) and refuse MuJoCo 4.0.0 (a solver bug fixed in 4.0.1); CI runs the README's test
commands, one per line; this environment's MuJoCo is within the bounds."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import mujoco
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def requirement(name: str, extra: str | None = None) -> Requirement:
    """pyproject's requirement of the distribution ``name`` (in ``extra``, if given)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = project["optional-dependencies"][extra] if extra else project["dependencies"]
    (match,) = [Requirement(r) for r in found if Requirement(r).name == name]
    return match


def dev_pins() -> dict[str, str]:
    """The versions scripts/dev.sh pins for the MuJoCo 4 environment: name -> version."""
    text = (ROOT / "scripts" / "dev.sh").read_text()
    (pins,) = re.findall(r"^MUJOCO4_PINS=\((.*)\)$", text, flags=re.M)
    return dict(re.findall(r"'([\w-]+)==([\w.]+)'", pins))


@pytest.mark.parametrize(("version", "admitted"), [
    ("3.16.0", True), ("4.0.1", True), ("4.0.0", False), ("3.15.0", False), ("4.1.0", False)])
def test_the_mujoco_bounds_admit_the_tested_releases_only(version, admitted):
    actual = requirement("mujoco").specifier.contains(version)

    assert actual == admitted


@pytest.mark.parametrize(("version", "admitted"), [
    ("3.16.0", True), ("4.0.0", True), ("3.17.0", False), ("4.1.0", False)])
def test_the_gpu_extra_admits_mujoco_warp_of_the_tested_lines(version, admitted):
    actual = requirement("mujoco-warp", "gpu").specifier.contains(version)

    assert actual == admitted


def test_the_mujoco_4_environment_installs_releases_the_bounds_admit():
    pins = dev_pins()

    assert requirement("mujoco").specifier.contains(pins["mujoco"])
    assert requirement("mujoco-warp", "gpu").specifier.contains(pins["mujoco-warp"])
    assert pins["mujoco"].split(".")[:2] == pins["mujoco-warp"].split(".")[:2]


def test_this_environment_runs_a_mujoco_the_bounds_admit():
    assert requirement("mujoco").specifier.contains(mujoco.__version__)
    try:
        warp = importlib.metadata.version("mujoco-warp")
    except importlib.metadata.PackageNotFoundError:
        return
    assert warp.split(".")[:2] == mujoco.__version__.split(".")[:2], (warp, mujoco.__version__)


def test_ci_runs_the_readme_test_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()

    commands = [line.split("#")[0].replace("exec ", "").replace('"$@"', "").strip()
                for line in ci.splitlines() if line.lstrip().startswith(("bash", "exec bash"))]

    assert commands == ["bash scripts/dev.sh test", "bash scripts/dev.sh test --mujoco 4 --fast"]
    assert all(command in readme for command in commands)


def test_the_all_extra_keeps_mujoco_warp_on_flygym_s_line():
    # mujoco-warp 4.0 declares only mujoco>=3.13: without flygym's own warp extra in `all`,
    # pip paired flygym's MuJoCo 3.16 with mujoco-warp 4.0 on a fresh machine.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["optional-dependencies"]["all"]]

    (flygym,) = [r for r in found if r.name == "flygym"]
    assert "warp" in flygym.extras
    assert flygym.specifier == requirement("flygym", "flygym").specifier


@pytest.mark.warp
def test_mujoco_warp_of_another_line_is_named_with_the_install_that_fixes_it(monkeypatch):
    from flyarchive import warp_log

    mujoco_warp = warp_log.import_mujoco_warp("this test")
    other = "4.0.1" if mujoco.__version__.startswith("3.") else "3.16.0"
    monkeypatch.setattr(mujoco, "__version__", other)

    with pytest.warns(UserWarning, match=r"pip install 'mujoco-warp==%s\.\*'" % re.escape(
            ".".join(other.split(".")[:2]))):
        warp_log._warn_of_another_line.__wrapped__(mujoco_warp)


@pytest.mark.warp
def test_mujoco_warp_of_mujoco_s_line_says_nothing(recwarn):
    from flyarchive import warp_log

    warp_log._warn_of_another_line.__wrapped__(warp_log.import_mujoco_warp("this test"))

    assert [str(w.message) for w in recwarn if "mujoco-warp" in str(w.message)] == []
