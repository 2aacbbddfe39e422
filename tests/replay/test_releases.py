"""The visual defaults of the release that recorded an archive, pinned for replay
(flyarchive.replay.releases): MuJoCo 4's "auto" headlight is on for an archive recorded
before MuJoCo 4, as that release compiled it; nothing else is touched."""

from __future__ import annotations

import json

import pytest

from flyarchive.distribute.api import replay_model
from flyarchive.models import load_mjb
from flyarchive.replay.releases import HEADLIGHT_AUTO, pin_release_defaults, recorded_release
from flyarchive.store.dataset import open_header
from flyarchive.testing import tiny_model
from flyarchive.testing.fixtures import record


def auto_headlight():
    model = tiny_model()
    model.vis.headlight.active = HEADLIGHT_AUTO  # what MuJoCo 4 compiles by default
    return model


@pytest.mark.parametrize(("versions", "expected"), [
    ({"mujoco": "3.16.0"}, (3, 16)), ({"mujoco": "4.0.1"}, (4, 0)),
    ({"mujoco": "4.1.0rc1"}, (4, 1)), ({}, None), ({"mujoco": "unknown"}, None),
    ({"mujoco": 3}, None), ("3.16", None)])
def test_the_recording_release_is_read_from_the_versions_attribute(versions, expected):
    actual = recorded_release({"versions": versions})

    assert actual == expected


def test_an_auto_headlight_is_on_for_an_archive_recorded_before_mujoco_4():
    model = auto_headlight()

    pinned = pin_release_defaults(model, (3, 16))

    assert pinned.vis.headlight.active == 1
    assert model.vis.headlight.active == HEADLIGHT_AUTO  # the caller's model is not touched


@pytest.mark.parametrize("recorded", [(4, 0), (4, 1), None])
def test_an_auto_headlight_is_kept_for_mujoco_4_archives_and_unknown_releases(recorded):
    model = auto_headlight()

    pinned = pin_release_defaults(model, recorded)

    assert pinned is model and pinned.vis.headlight.active == HEADLIGHT_AUTO


@pytest.mark.parametrize("active", [0, 1])
def test_a_headlight_the_model_sets_is_kept(active):
    model = tiny_model()
    model.vis.headlight.active = active

    pinned = pin_release_defaults(model, (3, 16))

    assert pinned is model and pinned.vis.headlight.active == active


def test_replay_gives_workers_the_pinned_model_of_a_mujoco_3_archive(tmp_path):
    url = record(tiny_model(), str(tmp_path / "run.zarr"))
    meta = tmp_path / "run.zarr" / "zarr.json"
    root = json.loads(meta.read_text())
    root["attributes"]["versions"]["mujoco"] = "3.16.0"  # as a MuJoCo 3.16 recording says
    meta.write_text(json.dumps(root))

    model, blob = replay_model(url, open_header(url), auto_headlight())

    assert model.vis.headlight.active == 1 and load_mjb(blob).vis.headlight.active == 1
