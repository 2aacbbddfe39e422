"""One home for errors and install hints: every exception class in flyarchive.errors, install
hints written only by MissingDependencyError, bad options raised as flyarchive errors."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import flyarchive
from flyarchive.errors import MissingDependencyError, StorageBackendMissingError

ROOT = Path(__file__).resolve().parents[2]


def product_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(flyarchive.__path__, "flyarchive."):
        if info.name.startswith("flyarchive.testing") or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def test_every_exception_class_lives_in_errors() -> None:
    elsewhere = []
    for name in product_modules():
        if name == "flyarchive.errors":
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) \
                    and value.__module__ == name:
                elsewhere.append(f"{name}.{value.__name__}")

    assert elsewhere == []


def string_constants(path: Path) -> list[tuple[int, str]]:
    """Non-docstring string literals of a module, with their line numbers."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_install_hints_are_written_only_by_missing_dependency() -> None:
    # codecs.reader_needs tells what *another* reader needs; it is not a missing package.
    allowed = {"flyarchive/errors.py", "flyarchive/codecs.py"}
    by_hand = []
    for path in sorted((ROOT / "flyarchive").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where in allowed or "testing" in path.parts:
            continue
        by_hand += [f"{where}:{line}" for line, text in string_constants(path)
                    if "pip install" in text]

    assert by_hand == []


def test_a_missing_storage_backend_names_its_package_and_extra() -> None:
    s3 = flyarchive.errors.missing_storage_backend("s3://lab/run.zarr", ImportError("no s3fs"))
    gs = flyarchive.errors.missing_storage_backend("gs://lab/run.zarr")

    assert isinstance(s3, StorageBackendMissingError) and isinstance(s3, MissingDependencyError)
    assert "'s3fs'" in str(s3) and "pip install 'flyarchive[s3]'" in str(s3)
    assert "'gcsfs'" in str(gs) and str(gs).endswith("pip install gcsfs")


def bad_mode() -> None:
    from flyarchive.store import parse_mode

    parse_mode("x")


def misaligned_world_block() -> None:
    from flyarchive.store.claims import shards_of_block

    shards_of_block(0, 3, 2, 8)  # shards of 2 worlds: a block cannot end at 3


def impossible_crf() -> None:
    from flyarchive.video import VideoOptions

    VideoOptions(crf=99)


@pytest.mark.parametrize("call", [bad_mode, misaligned_world_block, impossible_crf])
def test_bad_options_raise_flyarchive_errors(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(flyarchive.OptionsError):
        call()


@pytest.mark.parametrize(("release", "said"), [
    ("3.16.0", "Install it with: pip install 'flyarchive[flygym]'"),
    ("4.0.1", "in an environment of MuJoCo 3.16 (flygym 2.1 needs it; this one runs MuJoCo "
              "4.0.1"),
])
def test_the_flygym_hint_fits_the_mujoco_line_it_is_given_on(monkeypatch, release, said) -> None:
    """On MuJoCo 4, pip install 'flyarchive[flygym]' alone would move the environment to
    3.16 in place, which breaks it (README: MuJoCo releases)."""
    import mujoco

    from flyarchive.errors import missing_dependency

    monkeypatch.setattr(mujoco, "__version__", release)

    assert said in str(missing_dependency("flygym", "flygym", "flyarchive demo"))


def test_the_demo_without_flygym_writes_nothing(monkeypatch, tmp_path) -> None:
    import importlib.util

    from flyarchive.demo import run_demo

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flygym" else real(name, *a))

    with pytest.raises(MissingDependencyError, match="flyarchive demo needs the package 'flygym'"):
        run_demo(tmp_path / "out")

    assert not (tmp_path / "out").exists()
