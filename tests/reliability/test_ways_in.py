"""One validation for every way in: every hostile archive of the harness
(flyarchive.testing.hostile_cases.CASES) goes through `flyarchive info` (the header),
open_archive (opened; opened and read), render planning and verify, and they agree
(flyarchive.testing.ways_in.disagreements): info, open_archive and planning refuse with the
same error or all accept; reading refuses what they refuse; verify reports what reading
refuses. Cases that could exhaust memory or hang run in capped processes under the
harness's memory cap, forked one per archive from one child that imports flyarchive once
(flyarchive.testing.ways_in.verdicts_isolated_many); the cases of flyarchive.testing.holes
(missing chunks, parts that disagree) run here. Each hostile archive is built once."""

import shutil
from pathlib import Path

import pytest

from flyarchive.testing.holes import INCONSISTENT_CASES, MISSING_CASES
from flyarchive.testing.hostile_cases import CASES, make_case, make_sound, snapshot
from flyarchive.testing.ways_in import disagreements, verdicts, verdicts_isolated_many

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(600)]

#: The cases judged in this process: no bombs.
HERE = [name for name in CASES if name in MISSING_CASES or name in INCONSISTENT_CASES]


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    return make_sound(str(tmp_path_factory.mktemp("sound") / "run.zarr"))


@pytest.fixture(scope="module")
def built(sound, tmp_path_factory):
    """Every hostile case: its archive's URL, and the snapshot of it before any way in."""
    folder = tmp_path_factory.mktemp("hostile")
    urls = {name: make_case(sound, name, folder / f"case{i}.zarr")
            for i, name in enumerate(CASES)}
    return {name: (url, snapshot(Path(url))) for name, url in urls.items()}


@pytest.fixture(scope="module")
def isolated(sound, built):
    """The verdicts of every case not judged here, each archive in a capped process."""
    names = [name for name in CASES if name not in HERE]
    return dict(zip(names, verdicts_isolated_many([built[name][0] for name in names],
                                                  timeout_s=60, warm=sound)))


@pytest.mark.parametrize("name", list(CASES))
def test_every_way_in_gives_one_verdict_on_each_hostile_archive(built, isolated, name):
    url, before = built[name]

    found = verdicts(url) if name in HERE else isolated[name]

    assert snapshot(Path(url)) == before
    assert disagreements(found) == []
    assert found["read"].refused and found["verify"].refused  # every case is damage
    if name in INCONSISTENT_CASES:  # refused at every door, with one message
        assert found["info"].error_type in ("SchemaError", "CorruptArchiveError")
        problem = found["info"].message.split("is damaged: ")[1].split(" Run `flyarchive")[0]
        assert problem.removeprefix("Schema: ") in found["verify"].message
    if name in MISSING_CASES:  # refused once read
        assert found["read"].error_type == "CorruptArchiveError", found["read"]
        assert "committed" in found["read"].message
        assert "flyarchive verify" in found["read"].message


def test_a_sound_archive_is_accepted_at_every_door(sound, tmp_path):
    url = str(tmp_path / "run.zarr")
    shutil.copytree(sound, url)

    found = verdicts(url)

    assert [way for way, v in found.items() if v.refused] == []
