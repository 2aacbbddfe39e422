"""Crafted kept models crash no process a user runs: ``flyarchive render`` (no ``--model``),
``flyarchive verify`` and ``flyarchive.load_kept_model``, each in a child process
(flyarchive.testing.model_fuzz), on archives whose kept model was fuzzed or edited and
named by its new hash. scripts/reliability_report.py runs many more seeds.

The seeds are chosen so that MuJoCo's own loader, run on their bytes in a process of its
own, crashes (SIGSEGV), raises mujoco.FatalError, refuses them, or loads them (then they
render); what each does differs between MuJoCo 3.16 and 4.0.1 (4's loader checks more, and
raises FatalError where 3.16 refuses), so each line runs the seeds of a FatalError and of a
sound load, the others as sweeps. A loader's SIGSEGV is met by default by the crafted
model (on both lines). The commands on one model run one after the other in one child process (a crash
of it would show as every later command crashed).
"""

import mujoco
import pytest

from flyarchive.testing.hostile_cases import make_sound, snapshot
from flyarchive.testing.model_fuzz import crafted, fuzz, make_case, put_model, run_commands, summarize

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(600), pytest.mark.slow]

#: Seeds of flyarchive.testing.model_fuzz.mutate and what each MuJoCo line does with their
#: bytes (measured: 3.16.0, 4.0.1).
SEEDS = {246: {3: "SIGSEGV", 4: "refused"}, 32: {3: "FatalError", 4: "refused"},
         128: {3: "refused", 4: "FatalError"}, 0: {3: "ok", 4: "ok"}}
LINE = int(mujoco.__version__.split(".")[0])
#: Seeds whose outcome on a line another test meets by default (the crafted SIGSEGV, the
#: crafted refusals of tests/bad_input/test_model_check.py).
_SWEEP_SEEDS = {3: {246, 128}, 4: {246, 32}}[LINE]


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    return make_sound(str(tmp_path_factory.mktemp("sound") / "run.zarr"))


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.sweep) if s in _SWEEP_SEEDS
                                  else s for s in SEEDS])
def test_fuzzed_kept_models_crash_no_calling_process(sound, tmp_path, seed):
    rows = fuzz(tmp_path, sound, [seed], together=True)

    summary = summarize(rows)
    assert (summary["crashes"], summary["unclear"]) == (0, 0), summary["failed_seeds"]
    assert {row["seed"]: row["check"] for row in rows} == {seed: SEEDS[seed][LINE]}
    for row in rows:
        outcomes = row["outcomes"]
        expected = (0, 0, 0) if row["check"] == "ok" else (2, 1, 2)  # verify: exit 1 FAILED
        assert (outcomes["render"]["exit"], outcomes["verify"]["exit"],
                outcomes["load_kept_model"]["exit"]) == expected, outcomes
        if row["check"] != "ok":  # a refusal says MuJoCo could not load it, and why
            said = "could not load" if row["check"] == "refused" else row["check"]
            assert said in outcomes["render"]["message"]
            assert "Pass --model to use a model you trust" in outcomes["render"]["message"]


def test_a_kept_model_that_crashes_the_loader_crashes_no_command(sound, tmp_path):
    url, _ = make_case(sound, 0, tmp_path / "crafted.zarr")
    put_model(url, crafted("segfault"))
    before = snapshot(tmp_path / "crafted.zarr")

    # one child runs the three commands; the loader crashes in the model check's own process
    outcomes = run_commands(("render", "verify", "load_kept_model"), url, tmp_path,
                            cache=tmp_path / "cache")

    assert [o.exit for o in outcomes.values()] == [2, 1, 2], outcomes
    assert all("crashed with SIGSEGV" in o.message for o in outcomes.values())
    assert "Pass --model to use a model you trust" in outcomes["render"].message
    assert outcomes["load_kept_model"].error_type == "UnsafeModelError"
    assert snapshot(tmp_path / "crafted.zarr") == before
    assert not (tmp_path / "render" / "videos").exists()
    assert not list(tmp_path.rglob("MUJOCO_LOG.TXT")) and not list(tmp_path.rglob("core*"))
