"""Docstrings and the README match the code: file names and placement render_videos
documents, every name in ``__all__`` and every flyarchive name the README uses exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import flyarchive

ROOT = Path(__file__).resolve().parents[2]


def test_render_videos_names_files_as_its_docstring_says() -> None:
    from flyarchive.video import safe_video_path

    doc = flyarchive.render_videos.__doc__ or ""

    assert safe_video_path("{out}", 3, "nmf/trackcam") == "{out}/world00003/nmf_trackcam-1b3fdcea.mp4"
    assert "``{out}/world00003/nmf_trackcam-1b3fdcea.mp4``" in doc
    assert safe_video_path("out", 3, "front") == "out/world00003/front.mp4"


@pytest.mark.parametrize(("backend", "n_videos", "where", "expected"), [
    ("gpu", 8, {"visible": "0"}, True),             # one GPU: in this process
    ("gpu", 8, {"visible": "01"}, False),           # two: a local cluster, one worker each
    ("gpu", 8, {"visible": "01", "gpus": [1]}, True),
    ("gpu", 1, {"visible": "01"}, True),            # one video: one GPU
    ("gpu", 8, {"scheduler": "tcp://x:8786"}, False),
    ("warp-cpu", 8, {"n_workers": 1}, True),
    ("warp-cpu", 8, {"n_workers": 0}, True),
    ("warp-cpu", 1, {"n_workers": 4}, True),        # one video
    ("warp-cpu", 8, {"n_workers": 4}, False),       # a local cluster
    ("warp-cpu", 8, {"n_workers": 4, "in_process": True}, True),
])
def test_where_warp_renders_run_is_what_render_videos_documents(
        backend: str, n_videos: int, where: dict, expected: bool) -> None:
    from flyarchive.distribute.placement import runs_here
    from flyarchive.distribute.gpus import Gpu

    if "visible" in where:  # a fake set of GPUs: "01" is two
        where = {**where, "visible": [Gpu(int(i), i) for i in where["visible"]]}

    assert runs_here(backend, n_videos, **where) is expected


def test_every_name_in_all_resolves() -> None:
    missing = [name for name in flyarchive.__all__ if not hasattr(flyarchive, name)]

    assert missing == []


def test_every_flyarchive_name_the_readme_uses_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    dotted = set(re.findall(r"\bflyarchive(?:\.[A-Za-z_]\w*)+", readme))
    imported = re.findall(r"from (flyarchive[\w.]*) import ([\w, ]+)", readme)
    missing = []

    for chain in sorted(dotted):
        if not _resolves(chain):
            missing.append(chain)
    for module, names in imported:
        missing += [f"{module}.{n.strip()}" for n in names.split(",")
                    if not _resolves(f"{module}.{n.strip()}")]

    assert missing == []


def _resolves(chain: str) -> bool:
    """``a.b.c`` names a module, or an attribute of the longest importable prefix."""
    parts = chain.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True
    return False
