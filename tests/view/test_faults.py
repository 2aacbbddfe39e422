"""The viewer's archive changing under it, and its storage failing (issue 33): every route
that answers from the archive sees a replaced or deleted archive (409, never values kept
from the old one), "open it again" loads the new archive's model too, a page that shows
another archive than the viewer's is told so, and an S3 endpoint that goes down is said
(503) while the server stays up and answers again when it is back."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyarchive.testing.fixtures import copy_archive
from flyarchive.testing.markers import requires_view
from flyarchive.testing.view import ask, origin

pytestmark = requires_view

#: Every route that answers from the archive (GET path, or POST path and body).
ROUTES = [("GET", "/api/info", None), ("GET", "/api/model", None), ("GET", "/api/table", None),
          ("GET", "/api/traces?worlds=0&dof=shoulder", None), ("GET", "/api/scene", None),
          ("GET", "/api/meshes", None), ("GET", "/api/poses?worlds=0&start=0&count=1", None),
          ("POST", "/api/render", {"worlds": [0], "camera": "front"})]


@pytest.fixture(scope="module")
def view_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    from flyarchive.testing.view import view_archive

    return view_archive(str(tmp_path_factory.mktemp("view-faults") / "run.zarr"))


@pytest.fixture
def served(view_url: str, tmp_path: Path) -> Iterator[tuple[Any, Any, str]]:
    """``(served, log, url)``: a viewer of a copy of the archive, every route answered
    once (states and the model loaded, the scene built)."""
    from flyarchive.testing.view import serving

    url = copy_archive(view_url, tmp_path / "run.zarr")
    with serving(url, out=tmp_path / "videos", backend="opengl") as (server, log):
        for method, path, body in ROUTES[:-1]:
            assert call(server, method, path, body)[0] == 200, path
        yield server, log, url


def call(served: Any, method: str, path: str, body: Any = None, **headers: str
         ) -> tuple[int, bytes]:
    status, _, text = ask(origin(served) + path, method=method, body=body,
                          headers={"X-Flyarchive-Token": served.token,
                                   "Content-Type": "application/json", **headers})
    return status, text


def trace_values(blob: bytes) -> bytes:
    """The float64 values of a packed traces answer (after its head)."""
    size = int.from_bytes(blob[:4], "little")
    return blob[-(-(4 + size) // 8) * 8:]


def test_every_route_refuses_an_archive_replaced_since_it_was_opened(served):
    from flyarchive.testing.view import view_archive

    server, log, url = served
    shutil.rmtree(url)
    view_archive(url, n_worlds=4, mode="w-")  # the same shape: another archive_id

    answers = {path: call(server, method, path, body) for method, path, body in ROUTES}

    for path, (status, text) in answers.items():
        answer = json.loads(text)
        assert status == 409, path
        assert answer["replaced"] is True and "its archive_id is now" in answer["error"], path
    assert server.viewer.renders.jobs == {}


def test_traces_of_worlds_read_before_a_replacement_are_not_answered_from_what_was_kept(served):
    from flyarchive.testing.view import view_archive

    server, _, url = served
    path = "/api/traces?worlds=0,1&dof=shoulder"
    _, before = call(server, "GET", path)
    shutil.rmtree(url)
    view_archive(url, n_worlds=4, n_steps=120, mode="w-")  # other values, fewer frames

    status, _ = call(server, "GET", path)
    reopened = call(server, "POST", "/api/reopen")[0]
    again, after = call(server, "GET", path)

    assert status == 409
    assert reopened == again == 200
    assert trace_values(after) != trace_values(before)
    assert json.loads(after[4:4 + int.from_bytes(after[:4], "little")])["frames"] == 31


def test_an_archive_recorded_with_another_model_opened_again_loads_that_model(served):
    from flyarchive.testing import slider_model
    from flyarchive.testing.fixtures import record

    server, _, url = served
    _, before = call(server, "GET", "/api/model")
    shutil.rmtree(url)
    record(slider_model(), url, n_worlds=3, output_fps=10)

    refused = call(server, "GET", "/api/poses?worlds=0&start=0&count=1")[0]
    reopened, info = call(server, "POST", "/api/reopen")
    _, model = call(server, "GET", "/api/model")
    poses_status, _, poses = ask(f"{origin(server)}/api/poses?worlds=0&start=0&count=1",
                                 headers={"X-Flyarchive-Token": server.token})

    assert refused == 409 and reopened == 200
    assert json.loads(info)["dofs"] == ["x"] and json.loads(info)["worlds"] == 3
    assert json.loads(model)["bodies"] != json.loads(before)["bodies"]
    assert poses_status == 200
    geoms = len(server.viewer.poser.geoms)
    assert len(poses) == 1 * 1 * (geoms + 1) * 12 * 4  # the new model's geoms


def test_a_model_file_that_does_not_fit_the_archive_opened_again_is_said(view_url, tmp_path):
    import mujoco

    from flyarchive.testing import slider_model, tiny_model
    from flyarchive.testing.fixtures import record
    from flyarchive.testing.view import serving

    url = copy_archive(view_url, tmp_path / "run.zarr")
    mujoco.mj_saveModel(tiny_model(), str(tmp_path / "tiny.mjb"))
    with serving(url, model_path=str(tmp_path / "tiny.mjb"), out=tmp_path / "videos",
                 backend="opengl") as (server, _):
        assert server.viewer.load_model() is not None
        shutil.rmtree(url)
        record(slider_model(), url, n_worlds=2, output_fps=10)

        call(server, "POST", "/api/reopen")
        _, model = call(server, "GET", "/api/model")
        status, poses = call(server, "GET", "/api/poses?worlds=0&start=0&count=1")

    assert json.loads(model)["model"] is False
    assert "The model does not fit the archive" in json.loads(model)["model_problem"]
    assert status == 400 and "No 3D view" in json.loads(poses)["error"]


def test_a_page_that_shows_another_archive_is_told_to_open_it_again(served):
    server, _, _ = served

    status, text = call(server, "GET", "/api/table", **{"X-Flyarchive-Archive": "0123-old"})

    answer = json.loads(text)
    assert status == 409 and answer["replaced"] is True
    assert "This page shows the archive '0123-old'" in answer["error"]


def test_an_archive_deleted_while_open_is_said_and_the_viewer_stays_up(served):
    from flyarchive.testing.view import view_archive

    server, log, url = served
    shutil.rmtree(url)

    table = call(server, "GET", "/api/table")
    reopen = call(server, "POST", "/api/reopen")
    status = call(server, "GET", "/api/render/1")[0]
    view_archive(url, n_worlds=2, mode="w-")
    reopened = call(server, "POST", "/api/reopen")
    again = call(server, "GET", "/api/table")

    assert table[0] == 409 and "it is gone" in json.loads(table[1])["error"]
    assert reopen[0] == 400 and "run.zarr" in json.loads(reopen[1])["error"]
    assert status == 400  # no such render: the server still answers
    assert reopened[0] == again[0] == 200 and json.loads(again[1])["total"] == 2
    assert not log.having("internal error")


def test_an_s3_endpoint_down_mid_session_is_said_and_the_viewer_answers_when_it_is_back(
        s3_server, view_url, tmp_path):
    from flyarchive.testing.faultproxy import FaultPlan, FaultProxy
    from flyarchive.testing.view import serving
    from flyarchive.view.shown_archive import CHECK_WAIT_S

    url = f"s3://flyarchive-test/{uuid.uuid4().hex}.zarr"
    copy_archive(view_url, url, s3_server.storage_options())
    with FaultProxy(s3_server.endpoint_url) as proxy, \
            serving(url, storage_options=proxy.storage_options(), out=tmp_path / "videos",
                    backend="opengl") as (server, log):
        first = call(server, "GET", "/api/traces?worlds=0&dof=shoulder")[0]
        proxy.plan = FaultPlan(drop=1.0)

        started = time.monotonic()
        down = [call(server, "GET", path) for path in ("/api/table",
                                                       "/api/traces?worlds=0&dof=shoulder")]
        took = time.monotonic() - started
        proxy.plan = FaultPlan()
        back = 0
        while back != 200 and time.monotonic() - started < 120:  # the check under way ends
            back = call(server, "GET", "/api/traces?worlds=0,1&dof=shoulder")[0]

    assert first == 200 and back == 200
    assert took < 2 * CHECK_WAIT_S + 5  # said within the wait, not after the storage's retries
    for status, text in down:
        message = json.loads(text)["error"]
        assert status == 503 and "The archive's storage did not answer" in message
        assert "keeps running" in message and "\n" not in message
    assert not log.having("internal error")
