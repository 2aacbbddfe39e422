"""The releases that appended to an archive: ``versions`` names those that created it;
a writer of other releases adds an entry to ``appended_with`` with its first commit,
which ``flyarchive info`` shows."""

from __future__ import annotations

import pytest

from flyarchive import open_archive
from flyarchive.store import creation
from flyarchive.store.integrity import verify
from flyarchive.summary import summary_lines, summarize
from flyarchive.testing import tiny_model
from flyarchive.testing.fixtures import record

OTHER = {"flyarchive": "9.9.9", "mujoco": "4.0.1", "numpy": "2.0.0"}


def entries(url):
    return [(e["versions"], e["from_frame"]) for e in open_archive(url).attrs.get(
        creation.APPENDED_ATTR, [])]


@pytest.fixture
def url(tmp_path):
    return record(tiny_model(), str(tmp_path / "run.zarr"), n_steps=40)  # 11 frames


def test_a_writer_of_other_releases_says_so_and_from_which_frame(url, monkeypatch):
    created = open_archive(url).attrs["versions"]
    monkeypatch.setattr(creation, "package_versions", lambda: dict(OTHER))

    record(tiny_model(), url, n_steps=76, mode="a")

    assert entries(url) == [(OTHER, 11)]
    assert open_archive(url).attrs["versions"] == created  # the creating releases kept
    assert verify(url).ok


def test_resuming_on_the_same_releases_adds_nothing(url, monkeypatch):
    record(tiny_model(), url, n_steps=60, mode="a")  # the creating releases
    monkeypatch.setattr(creation, "package_versions", lambda: dict(OTHER))
    record(tiny_model(), url, n_steps=76, mode="a")
    record(tiny_model(), url, n_steps=96, mode="a")  # the same other releases again

    assert entries(url) == [(OTHER, 16)]


def test_a_writer_that_commits_nothing_says_nothing(url, monkeypatch):
    monkeypatch.setattr(creation, "package_versions", lambda: dict(OTHER))

    record(tiny_model(), url, n_steps=40, mode="a")  # its frames are committed already

    assert entries(url) == []


def test_info_names_the_releases_that_appended(url, monkeypatch):
    monkeypatch.setattr(creation, "package_versions", lambda: dict(OTHER))
    record(tiny_model(), url, n_steps=76, mode="a")

    lines = summary_lines(summarize(url))

    assert lines["appended_with"] == "from frame 11: flyarchive 9.9.9, mujoco 4.0.1, numpy 2.0.0"
