"""One validation for every way in: every hostile archive of the harness
(flyarchive.testing.hostile.CASES) goes through `flyarchive info` (the header),
open_archive (opened; opened and read), render planning and verify, and they agree
(flyarchive.testing.ways_in.disagreements): info, open_archive and planning refuse with the
same error or all accept; reading refuses what they refuse; verify reports what reading
refuses. Cases that could exhaust memory or hang run in a child process under the
harness's memory cap; the cases of flyarchive.testing.holes (missing chunks, parts that
disagree) run here."""

import shutil
from pathlib import Path

import pytest

from flyarchive.testing.holes import INCONSISTENT_CASES, MISSING_CASES
from flyarchive.testing.hostile import CASES, make_case, make_sound, snapshot
from flyarchive.testing.ways_in import disagreements, verdicts, verdicts_isolated

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    return make_sound(str(tmp_path_factory.mktemp("sound") / "run.zarr"))


def judged(sound, name, tmp_path):
    url = make_case(sound, name, tmp_path / "hostile.zarr")
    before = snapshot(Path(url))
    here = name in MISSING_CASES or name in INCONSISTENT_CASES  # no bombs: this process
    found = verdicts(url) if here else verdicts_isolated(url, timeout_s=60)
    assert snapshot(Path(url)) == before
    return found


@pytest.mark.parametrize("name", list(CASES))
def test_every_way_in_gives_one_verdict_on_each_hostile_archive(sound, name, tmp_path):
    found = judged(sound, name, tmp_path)

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
