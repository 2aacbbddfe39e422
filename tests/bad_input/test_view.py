"""Bad input to ``flyarchive view`` outside the browser: the command refuses before it
serves, and the server refuses requests it must not answer (the page's own messages are
tested in a real browser in tests/view/test_browser.py)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from flyarchive.testing.fixtures import copy_archive, snapshot
from flyarchive.testing.markers import requires_view

pytestmark = requires_view


@pytest.fixture(scope="module")
def view_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The viewer's archive (flyarchive.testing.view.view_archive), recorded once."""
    from flyarchive.testing.view import view_archive

    return view_archive(str(tmp_path_factory.mktemp("view-bad") / "run.zarr"))


@pytest.fixture(scope="module")
def viewed(view_url: str) -> Any:
    from flyarchive.testing.view import serving

    with serving(view_url, out=Path(view_url).parent / "videos", backend="cpu") as found:
        yield found


def ask(url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
        body: Any = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def origin(served: Any) -> str:
    return "{0.scheme}://{0.netloc}".format(urlsplit(served.url))


# ----------------------------------------------------------------------------- the command
def test_an_archive_that_does_not_exist_is_refused_before_serving(cli, tmp_path):
    code, out, err = cli("view", tmp_path / "missing.zarr", "--port", "0",
                         "--out", tmp_path / "videos")

    assert code == 2
    assert "flyarchive view: error:" in err and "missing.zarr" in err
    assert "open http" not in out


def test_a_model_file_that_does_not_exist_is_refused(cli, archive, tmp_path):
    before = snapshot(archive)

    code, out, err = cli("view", archive, "--model", tmp_path / "nmf.mjb", "--port", "0",
                         "--out", tmp_path / "videos")

    assert code == 2 and "No model file at" in err and "open http" not in out
    assert snapshot(archive) == before


def test_an_output_folder_that_is_a_file_is_refused(cli, archive, tmp_path):
    (tmp_path / "videos").write_text("not a folder")

    code, out, err = cli("view", archive, "--port", "0", "--out", tmp_path / "videos")

    assert code == 2 and "is a file" in err and "--out FOLDER" in err
    assert (tmp_path / "videos").read_text() == "not a folder"


def test_a_port_in_use_is_refused_when_asked_for(cli, archive, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        code, out, err = cli("view", archive, "--port", port, "--out", tmp_path / "videos")

    assert code == 2 and f"Cannot serve on 127.0.0.1:{port}" in err and "--port" in err


def test_serving_beyond_this_machine_says_what_it_exposes():
    from flyarchive.view.app import exposure_warning

    text = exposure_warning("0.0.0.0")

    assert "every world of the archive" in text and "token travels unencrypted" in text
    assert exposure_warning("127.0.0.1") == exposure_warning("::1") == ""


# ----------------------------------------------------------------------------- requests
def test_a_request_without_the_token_is_refused(viewed):
    served, log = viewed

    status, body = ask(origin(served) + "/api/info")

    assert status == 403 and "No access token" in body
    assert log.having("403 GET /api/info")


def test_a_post_with_the_cookie_but_without_the_header_is_refused(viewed):
    served, log = viewed
    cookie = f"flyarchive-view-{urlsplit(served.url).port}={served.token}"

    status, body = ask(origin(served) + "/api/render", method="POST",
                       headers={"Cookie": cookie, "Content-Type": "application/json"},
                       body={"worlds": [0], "camera": "front"})

    assert status == 403  # another site's page could make the browser send the cookie
    assert served.viewer.renders.jobs == {}


def test_another_host_name_is_refused(viewed):
    served, log = viewed

    status, body = ask(served.url, headers={"Host": f"attacker.example:{urlsplit(served.url).port}"})

    assert status == 403 and "does not answer requests for host" in body
    assert log.having("attacker.example")


@pytest.mark.parametrize("path, fragment", [
    ("/api/traces?worlds=0,99&dof=shoulder", "The archive has no world 99"),
    ("/api/traces?worlds=0&dof=shouldr", "Did you mean 'shoulder'"),
    ("/api/traces?worlds=0&dof=shoulder&width=abc", "width must be a whole number, not 'abc'"),
    ("/api/traces?worlds=x&dof=shoulder", "Cannot read worlds 'x'"),
    ("/api/poses?worlds=0&start=51", "the archive has frames 0 to 50"),
    ("/api/poses?worlds=0&start=0&count=100000", "one request covers 1 to 500"),
    ("/api/table?sort=nothing", "No column 'nothing' to sort by"),
    ("/api/render/7", "No render '7' in this viewer"),
])
def test_a_bad_api_request_gets_its_reason_and_a_log_line(viewed, path, fragment):
    served, log = viewed

    status, body = ask(origin(served) + path, headers={"X-Flyarchive-Token": served.token})

    assert status == 400
    assert fragment in json.loads(body)["error"]
    assert log.having(fragment)


def test_a_render_request_that_is_not_json_is_refused(viewed):
    served, log = viewed
    request = urllib.request.Request(origin(served) + "/api/render", data=b"{worlds: 0", method="POST",
                                     headers={"X-Flyarchive-Token": served.token})

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)

    assert caught.value.code == 400 and b"not JSON" in caught.value.read()
    assert served.viewer.renders.jobs == {}


@pytest.mark.parametrize("body, fragment", [
    ({"worlds": [], "camera": "front"}, "Select at least one world"),
    ({"worlds": [0], "camera": "side"}, "No camera 'side' in the model"),
    ({"worlds": list(range(17)), "camera": "front"}, "a render tiles at most 16"),
    ({"worlds": [0], "camera": "front", "size": "big"}, "Cannot read size 'big'"),
    ({"worlds": [0], "camera": "front", "start": "soon"}, "start must be a number of seconds"),
])
def test_a_bad_render_request_is_refused_before_it_is_queued(viewed, body, fragment):
    served, log = viewed

    status, text = ask(origin(served) + "/api/render", method="POST", body=body,
                       headers={"X-Flyarchive-Token": served.token,
                                "Content-Type": "application/json"})

    assert status == 400 and fragment in json.loads(text)["error"]
    assert served.viewer.renders.jobs == {}
    assert not list(Path(served.viewer.out).iterdir())


def test_an_archive_replaced_before_its_states_are_read_is_said(view_url, tmp_path):
    from flyarchive.errors import ArchiveReplacedError
    from flyarchive.testing.view import view_archive
    from flyarchive.view.app import Viewer

    url = copy_archive(view_url, tmp_path / "run.zarr")
    viewer = Viewer(url, out=tmp_path / "videos", backend="cpu")  # the header only
    view_archive(url, n_worlds=3, mode="w")  # written again before the dataset opened

    with pytest.raises(ArchiveReplacedError, match="was replaced after the viewer opened it"):
        viewer.viewed.states([0])

    assert viewer.viewed._ds is None  # nothing of the new archive mixed into the old table
    assert len(viewer.viewed.world_ids) == 4


@pytest.mark.parametrize("change, fragment", [
    ("written again", "its archive_id is now '"),
    ("deleted", "it is gone, or being written again now"),
])
def test_an_archive_replaced_after_its_states_were_read_is_said(view_url, tmp_path, change,
                                                                 fragment):
    import shutil

    from flyarchive.errors import ArchiveReplacedError
    from flyarchive.testing.view import view_archive
    from flyarchive.view.app import Viewer

    url = copy_archive(view_url, tmp_path / "run.zarr")
    viewer = Viewer(url, out=tmp_path / "videos", backend="cpu")
    kept = viewer.viewed.states([0])[0]["qpos"]  # the shards' indexes are kept now
    shutil.rmtree(url)
    if change == "written again":
        view_archive(url, n_worlds=4, mode="w-")  # the same sizes, another archive_id

    with pytest.raises(ArchiveReplacedError) as caught:
        viewer.viewed.states([1])
    with pytest.raises(ArchiveReplacedError, match="was replaced after the viewer opened it"):
        viewer.viewed.check_same()  # what every table request does first

    assert "was replaced after the viewer opened it" in str(caught.value)
    assert fragment in str(caught.value) and "Open it again" in str(caught.value)
    assert 1 not in viewer.viewed._cache  # nothing of the new archive kept
    assert viewer.viewed.states([0])[0]["qpos"] is kept


def test_a_model_file_that_is_no_model_is_said_when_the_3d_view_asks_for_it(view_url, tmp_path):
    from flyarchive.errors import SelectionError
    from flyarchive.view.app import Viewer

    url = copy_archive(view_url, tmp_path / "run.zarr")
    (tmp_path / "nmf.mjb").write_text("not a model")
    viewer = Viewer(url, model_path=str(tmp_path / "nmf.mjb"), out=tmp_path / "videos",
                    backend="cpu")  # served at once: the model loads after the first page

    answer = viewer.model_info()

    assert answer["model"] is False and "is not a compiled MuJoCo model" in answer["model_problem"]
    with pytest.raises(SelectionError, match="No 3D view: .*nmf.mjb"):
        viewer.poses({"worlds": "0", "start": "0", "count": "1"})
    assert (tmp_path / "nmf.mjb").read_text() == "not a model"
