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

import numpy as np
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


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_refused_in_one_line(cli, archive, tmp_path, port):
    code, _, err = cli("view", archive, "--port", port, "--out", tmp_path / "videos")

    assert code == 2 and err.count("\n") == 1
    assert f"port must be a whole number from 0 to 65535 (0: any free one), got {port}" in err


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1"])  # not an address; not this machine's
def test_a_host_that_is_not_an_address_of_this_machine_is_named_with_the_fix(
        cli, archive, tmp_path, host):
    code, _, err = cli("view", archive, "--host", host, "--port", "0",
                       "--out", tmp_path / "videos")

    assert code == 2 and err.count("\n") == 1
    assert f"{host!r} is not an address of this machine" in err and "--host" in err


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


def test_a_viewer_on_every_interface_answers_at_its_addresses_and_names_only(view_url):
    """--host 0.0.0.0 accepted only the Host header 0.0.0.0:PORT: every real client got 403."""
    from flyarchive.view.app import Viewer, start

    served = start(Viewer(view_url, out=Path(view_url).parent / "videos-any"), host="0.0.0.0")
    try:
        port = urlsplit(served.url).port
        here = f"http://127.0.0.1:{port}/api/info?token={served.token}"
        answers = {name: ask(here, headers={"Host": f"{name}:{port}"})[0]
                   for name in ("127.0.0.1", "192.0.2.2", "[::1]", socket.gethostname(),
                                "attacker.example", "192.0.2.2.nip.io")}
    finally:
        served.stop()

    assert urlsplit(served.url).hostname == socket.gethostname().lower()  # printed: its name
    assert answers == {"127.0.0.1": 200, "192.0.2.2": 200, "[::1]": 200,
                       socket.gethostname(): 200, "attacker.example": 403,
                       "192.0.2.2.nip.io": 403}


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
    assert 1 not in viewer.viewed._kept_states  # nothing of the new archive kept
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


# ----------------------------------------------------------------------------- issue 33
# Each case of issue 33 ("Why" and "Bad input") tried as an attacker would: a bad
# parameter answers 400 with one line (never a 500 or a traceback), a request past a bound
# answers 413 with the bound and how to narrow it, a log line escapes what the client sent
# and never prints the token.
from flyarchive.testing.view import ask as ask_raw  # noqa: E402
from flyarchive.testing.view import exchange  # noqa: E402


def token_headers(served: Any, **more: str) -> dict[str, str]:
    return {"X-Flyarchive-Token": served.token, **more}


def one_line_error(status: int, body: bytes) -> str:
    """The JSON error of an API answer, checked to be one line without a traceback."""
    message = json.loads(body)["error"]
    assert "\n" not in message and "Traceback" not in message and 'File "' not in message
    return message


def status_of(answer: bytes) -> int:
    """The status of a raw HTTP answer (``HTTP/1.x NNN ...``)."""
    return int(answer.split(b" ", 2)[1])


def untraced(log: Any) -> None:
    """No log line holds a traceback, a raw control character, or more than one line."""
    for line in log.lines:
        assert "Traceback" not in line and "\n" not in line and "\r" not in line
        assert "\x1b" not in line and "\x00" not in line


@pytest.fixture(scope="module")
def tight(view_url: str) -> Any:
    """A viewer of the same archive with small bounds: 6 trace lines, 2 worlds' states
    (8,160 bytes each) read, 2,000 bytes out, 1,000,000 render pixels, 1 render waiting per
    page and 2 in all, 3 jobs remembered, half a second for a request's head and body."""
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    limits = Limits(max_trace_lines=6, max_read_bytes=20_000, max_out_bytes=2_000,
                    max_render_pixels=1_000_000, max_queued_per_client=1, max_queued_renders=2,
                    max_jobs=3, header_timeout_s=0.5, body_timeout_s=0.5, max_per_address=5)
    with serving(view_url, out=Path(view_url).parent / "videos-tight", backend="opengl",
                 limits=limits) as found:
        yield found


@pytest.mark.parametrize("where, expected", [
    ("1/0 == 1", []),  # infinity, compared: no error
    ("world * 1e19 > 0", [1, 2, 3]),
    ("world * 10000000000000000000 > 0", [1, 2, 3]),  # an int past int64: float64
    ("world > 100000000000000000000", []),
    ("1 % 0 == 0", []),  # NaN compares False
    ("(-world - 9223372036854775807) * 2 > 0", []),  # no wrap-around past int64
])
def test_a_filter_with_extreme_arithmetic_is_answered_not_failed(viewed, where, expected):
    from urllib.parse import quote

    served, log = viewed

    status, _, body = ask_raw(f"{origin(served)}/api/table?where={quote(where)}",
                              headers=token_headers(served))

    assert status == 200
    assert json.loads(body)["matched_worlds"] == expected
    untraced(log)


@pytest.mark.parametrize("where, fragment", [
    ("9" * 400 + " > world", "holds a number of 400 digits, beyond what a float64 holds"),
    ("(" * 300 + "world" + ")" * 300 + " > 1", "Cannot read the filter"),
    ("world == 1\x1b[2J\r\nforged", "Cannot read the filter"),
])
def test_a_filter_that_cannot_be_read_answers_one_line(viewed, where, fragment):
    from urllib.parse import quote

    served, log = viewed

    status, _, body = ask_raw(f"{origin(served)}/api/table?where={quote(where)}",
                              headers=token_headers(served))

    assert status == 400 and fragment in one_line_error(status, body)
    untraced(log)


def test_control_characters_in_a_filter_are_escaped_in_its_message_and_log(viewed):
    from urllib.parse import quote

    served, log = viewed

    status, _, body = ask_raw(f"{origin(served)}/api/table?where={quote('sucess' + chr(27) + '[2J == 1')}",
                              headers=token_headers(served))

    message = one_line_error(status, body)
    assert status == 400 and "\x1b" not in message and "\\x1b[2J" in message
    assert log.having("\\x1b[2J") and not log.having("\x1b")


@pytest.mark.parametrize("query, fragment", [
    ("start=1&end=0.5", "start 1 s is after end 0.5 s"),
    ("start=nan", "start must be a number, not 'nan'"),
    ("end=1e400", "end must be a number, not '1e400'"),
    ("start=inf", "start must be a number, not 'inf'"),
    ("start=100", "No frame lies between 100 s and the end"),
    ("width=0", "A trace is 1 to 4000 pixels wide"),
    ("width=" + "9" * 5000, "width must be a whole number"),
    ("worlds=" + "9" * 5000, "Cannot read worlds"),
    ("keypoint=" + "b" * 5000, "The model has no body 'bbbbbbbbbb"),
    ("keypoint=tors", "The model has no body 'tors'. Did you mean 'torso'?"),
])
def test_a_bad_trace_window_answers_400_with_one_line(viewed, query, fragment):
    served, log = viewed
    if query.startswith("keypoint="):
        query = f"worlds=0&{query}"
    elif not query.startswith("worlds="):
        query = f"worlds=0&dof=shoulder&{query}"
    else:
        query += "&dof=shoulder"

    status, _, body = ask_raw(f"{origin(served)}/api/traces?{query}",
                              headers=token_headers(served))

    assert status == 400 and fragment in one_line_error(status, body)
    untraced(log)


def test_a_dof_or_world_asked_many_times_is_drawn_once(viewed):
    from flyarchive.view.traces import MAX_WORLDS

    served, _ = viewed
    worlds = ",".join(["0", "1"] * (MAX_WORLDS // 2))  # 200 ids, 2 worlds
    dofs = ",".join(["shoulder"] * 100)

    status, _, body = ask_raw(f"{origin(served)}/api/traces?worlds={worlds}&dof={dofs}",
                              headers=token_headers(served))

    assert status == 200
    size = int.from_bytes(body[:4], "little")
    head = json.loads(body[4:4 + size])
    assert head["labels"] == ["shoulder"] and head["lines"] == [[0, "shoulder"], [1, "shoulder"]]


@pytest.mark.parametrize("query, fragment", [
    ("worlds=0&dof=root/x,root/y,root/z,shoulder,slider,wrist/qw,wrist/qx",
     "The traces would be 7 lines; one request may take at most 6"),
    ("worlds=0,1,2&dof=shoulder", "The states read for the traces would be 24,480 bytes"),
    ("worlds=0&dof=root/x,root/y,root/z,shoulder,slider",
     "The traces' answer would be 2,040 bytes; one request may take at most 2,000"),
])
def test_a_trace_request_past_a_bound_answers_413_with_the_bound_before_any_read(tight, query,
                                                                                 fragment):
    served, log = tight
    kept = served.viewer.viewed._kept_states
    before = {world: kept.peek(world) for world in kept.keys()}

    status, _, body = ask_raw(f"{origin(served)}/api/traces?{query}", headers=token_headers(served))

    message = one_line_error(status, body)
    assert status == 413 and fragment in message and "Select fewer" in message
    assert {world: kept.peek(world) for world in kept.keys()} == before  # nothing read
    assert log.having("413 GET /api/traces")


def test_the_issues_traces_request_is_refused_before_it_takes_memory(tight):
    served, _ = tight
    worlds = ",".join(["0", "1", "2", "3"] * 50)
    dofs = ",".join(f"{d}" for d in served.viewer.viewed.dofs) + "," + "shoulder," * 100

    status, _, body = ask_raw(f"{origin(served)}/api/traces?worlds={worlds}&dof={dofs}&width=4000",
                              headers=token_headers(served))

    assert status == 413 and "would be 52 lines" in one_line_error(status, body)


@pytest.mark.parametrize("query, status, fragment", [
    ("worlds=0,1,2&start=0&count=1", 413, "The states read for the poses would be 24,480 bytes"),
    ("worlds=0&start=0&count=51", 413, "The poses' answer would be"),
    ("worlds=0&start=nan", 400, "start must be a whole number, not 'nan'"),
    ("worlds=0&start=1e400", 400, "start must be a whole number, not '1e400'"),
])
def test_a_pose_request_past_a_bound_or_unreadable_is_refused(tight, query, status, fragment):
    served, _ = tight

    got, _, body = ask_raw(f"{origin(served)}/api/poses?{query}", headers=token_headers(served))

    assert got == status and fragment in one_line_error(got, body)


def post_render(served: Any, data: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    return ask_raw(f"{origin(served)}/api/render", method="POST", data=data,
                   headers=token_headers(served, **{"Content-Type": "application/json",
                                                    **headers}))


@pytest.mark.parametrize("data, status, fragment", [
    (b'{"worlds": [NaN], "camera": "front"}', 400, "holds NaN, which is no number"),
    (b'{"worlds": [Infinity], "camera": "front"}', 400, "holds Infinity, which is no number"),
    (b'{"worlds": [1e400], "camera": "front"}', 400, "worlds must hold whole numbers"),
    (b'{"worlds": [0.5], "camera": "front"}', 400, "worlds must hold whole numbers"),
    (b'{"worlds": ["0"], "camera": "front"}', 400, "worlds must hold whole numbers"),
    (b'{"worlds": [true], "camera": "front"}', 400, "worlds must hold whole numbers"),
    (b'{"worlds": 0, "camera": "front"}', 400, "worlds must be a list of world ids"),
    (b'{"worlds": [[[[0]]]], "camera": "front"}', 400, "worlds must hold whole numbers"),
    (b'{"worlds": [0], "camera": "front", "start": NaN}', 400, "holds NaN"),
    (b'{"worlds": [0], "camera": "front", "start": 1e400}', 400, "start must be a number of seconds"),
    (b'{"worlds": [0], "camera": "front", "start": 0.3, "end": 0.1}', 400,
     "start 0.3 s is after end 0.1 s"),
    (b'{"worlds": [0], "camera": "front", "end": -5}', 400, "No frame lies between"),
    (b'{"worlds": [0], "camera": 7}', 400, "camera and size are text"),
    (b'{"worlds": [0], "camera": "front", "size": "99999999x2"}', 400, "Cannot read size"),
    (b'{"worlds": [0], "camera": "front", "quality": 9}', 400, "A render request has no key 'quality'"),
    (b'[0, 1]', 400, "A render request is a JSON object"),
    (b'"\xff\xfe"', 400, "not UTF-8"),
    (b"[" * 30_000 + b"]" * 30_000, 400, "nested too deep"),
    (b"[" * 100_000 + b"]" * 100_000, 413, "over 65,536 bytes"),
])
def test_a_bad_render_body_answers_one_line_and_queues_nothing(viewed, data, status, fragment):
    served, log = viewed

    got, _, body = post_render(served, data)

    assert got == status and fragment in one_line_error(got, body)
    assert served.viewer.renders.jobs == {}
    untraced(log)


def test_a_render_start_of_nan_makes_no_job_whose_status_fails_for_the_servers_life(viewed):
    served, _ = viewed
    post_render(served, b'{"worlds": [0], "camera": "front", "start": NaN}')

    status, _, body = ask_raw(f"{origin(served)}/api/render/1", headers=token_headers(served))
    info, _, _ = ask_raw(f"{origin(served)}/api/info", headers=token_headers(served))

    assert status == 400 and "No render '1' in this viewer" in one_line_error(status, body)
    assert info == 200


def test_a_render_past_the_pixel_bound_answers_413_before_it_is_queued(tight):
    served, _ = tight

    status, _, body = post_render(served, b'{"worlds": [0, 1], "camera": "front"}')

    message = one_line_error(status, body)
    assert status == 413 and "The render would be 7,833,600 pixels" in message
    assert "a smaller size or a shorter time window" in message
    assert not [job for job in served.viewer.renders.jobs.values() if job.worlds == [0, 1]]


def test_a_json_body_of_10_megabytes_answers_413_without_being_read_whole(viewed):
    served, log = viewed
    data = json.dumps({"worlds": [0], "camera": "front", "pad": "x" * (10 << 20)}).encode()

    status, _, body = post_render(served, data)

    assert status == 413 and "over 65,536 bytes" in one_line_error(status, body)
    assert served.viewer.renders.jobs == {}


@pytest.mark.parametrize("path", ["/video/" + "9" * 5000 + ".mp4", "/api/render/" + "9" * 5000,
                                  "/video/99999999999.mp4"])
def test_a_job_number_of_thousands_of_digits_is_no_such_page(viewed, path):
    served, log = viewed

    status, _, body = ask_raw(origin(served) + path, headers=token_headers(served))

    assert status == 404 and b"no such page" in body and b"Traceback" not in body
    untraced(log)


@pytest.mark.parametrize("query, fragment", [
    ("page=" + "9" * 5000, "page must be a whole number below 10**18"),
    ("size=abc", "size must be a whole number"),
    ("size=100000", "A page holds 1 to 500 rows"),
])
def test_a_bad_table_page_answers_400(viewed, query, fragment):
    served, _ = viewed

    status, _, body = ask_raw(f"{origin(served)}/api/table?{query}", headers=token_headers(served))

    assert status == 400 and fragment in one_line_error(status, body)


def test_a_post_with_the_token_only_in_the_address_is_refused(viewed):
    served, log = viewed

    status, _, body = ask_raw(f"{origin(served)}/api/render?token={served.token}", method="POST",
                              data=b'{"worlds": [0], "camera": "front"}',
                              headers={"Content-Type": "text/plain"})

    assert status == 403 and "needs the token in the X-Flyarchive-Token header" in \
        one_line_error(status, body)
    assert served.viewer.renders.jobs == {}
    assert not any(served.token in line for line in log.lines)


def test_a_reopen_with_the_token_only_in_the_address_is_refused(viewed):
    served, _ = viewed
    generation = served.viewer.viewed.generation

    status, _, _ = ask_raw(f"{origin(served)}/api/reopen?token={served.token}", method="POST")

    assert status == 403 and served.viewer.viewed.generation == generation


@pytest.mark.parametrize("path", ["/%0d%0a[flyarchive%20view%2012:00:00]%20render%201%20done",
                                  "/%1b]0;owned%07%1b[2J", "/%e2%80%ae%00etc"])
def test_an_unauthenticated_path_with_control_characters_is_logged_escaped(viewed, path):
    served, log = viewed

    status, _, _ = ask_raw(origin(served) + path)

    assert status == 403
    line = log.having("403 GET /")[-1]
    assert "\\x" in line  # \r \n \x1b \x07 \x00 written as escapes
    untraced(log)
    assert not any("\u202e" in line for line in log.lines)


def test_the_token_never_reaches_a_log_line(viewed):
    served, log = viewed

    ask_raw(f"{origin(served)}/no-such-page?token={served.token}")
    ask_raw(f"{origin(served)}/api/traces?worlds=x&token={served.token}")
    ask_raw(f"{origin(served)}/{served.token}", headers=token_headers(served))

    assert log.having("404 GET") and log.having("Cannot read worlds")
    assert not any(served.token in line for line in log.lines)
    assert log.having("<token>")  # the path that was the token


def test_a_host_header_with_control_characters_is_refused_and_escaped(viewed):
    served, log = viewed
    port = urlsplit(served.url).port

    answer = exchange(served.url, f"GET / HTTP/1.1\r\nHost: evil\x1b[2J:{port}\r\n\r\n".encode())

    assert status_of(answer) == 400 and b"Traceback" not in answer
    untraced(log)


def test_a_request_line_of_64_kilobytes_answers_400_in_one_line(viewed):
    served, log = viewed

    answer = exchange(served.url, b"GET /" + b"a" * (64 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n")

    assert status_of(answer) == 400 and b"Traceback" not in answer
    untraced(log)


@pytest.mark.parametrize("value", ["bytes=" + "0-1," * 20_000 + "0-1", "bytes=0-" + "9" * 9000])
def test_a_huge_range_header_answers_400_in_one_line(viewed, value):
    served, log = viewed

    answer = exchange(served.url, f"GET /api/info HTTP/1.1\r\nHost: x\r\nRange: {value}\r\n"
                                  f"X-Flyarchive-Token: {served.token}\r\n\r\n".encode())

    assert status_of(answer) == 400 and b"Traceback" not in answer
    untraced(log)


def test_an_unknown_method_answers_405_in_one_line(viewed):
    served, _ = viewed

    status, _, body = ask_raw(f"{origin(served)}/api/info", method="DELETE",
                              headers=token_headers(served))

    assert status == 405 and "use GET or HEAD" in one_line_error(status, body)


def test_a_fault_of_the_viewer_answers_500_in_one_line_and_logs_its_place(viewed, monkeypatch):
    served, log = viewed

    def broken() -> dict:
        raise KeyError("a bug")

    monkeypatch.setattr(served.viewer, "info", broken)
    status, _, body = ask_raw(f"{origin(served)}/api/info", headers=token_headers(served))

    message = one_line_error(status, body)
    assert status == 500 and "The viewer failed to answer (KeyError)" in message
    assert "a bug" not in message  # the details go to the log, not the client
    line = log.having("internal error KeyError")[-1]
    assert "test_view.py:" in line and "please report" in line
    untraced(log)


# ----------------------------------------------------------------------------- issue 34
# The gait panels' requests: a bad parameter answers 400 with one line, a request past a
# bound 413 before anything is computed, a model without a fly (or no model) says so.
@pytest.fixture(scope="module")
def walker_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """20 worlds of the six-legged walker, 100 frames (0 to 0.792 s), its model kept."""
    from flyarchive.testing.view import walker_view_archive

    return walker_view_archive(str(tmp_path_factory.mktemp("view-gait") / "walker.zarr"))


@pytest.fixture(scope="module")
def walking(walker_url: str) -> Any:
    from flyarchive.testing.view import serving

    with serving(walker_url, out=Path(walker_url).parent / "videos", backend="opengl") as found:
        yield found


def gait_of(served: Any, query: str) -> tuple[int, bytes]:
    status, _, body = ask_raw(f"{origin(served)}/api/gait?{query}", headers=token_headers(served))
    return status, body


@pytest.mark.parametrize("query, fragment", [
    ("worlds=99", "The archive has no world 99; it holds 20 worlds with ids 0 to 19"),
    ("worlds=", "Select at least one world in the table to see its gait"),
    ("worlds=" + ",".join(map(str, range(17))), "the gait panels show at most 16"),
    ("worlds=x", "Cannot read worlds 'x'"),
    ("worlds=0&start=nan", "start must be a number, not 'nan'"),
    ("worlds=0&end=inf", "end must be a number, not 'inf'"),
    ("worlds=0&start=5", "No frame lies between 5 s and the end; the archive's frames: from 0 to 0.792 s"),
    ("worlds=0&start=0.5&end=0.2", "start 0.5 s is after end 0.2 s"),
    ("worlds=0&start=0.008&end=0.01", "Gait needs at least 2 frames; the window holds 1"),
])
def test_a_bad_gait_request_answers_400_with_one_line(walking, query, fragment):
    served, log = walking

    status, body = gait_of(served, query)

    assert status == 400 and fragment in one_line_error(status, body)
    assert log.having("400 GET /api/gait")
    untraced(log)


def test_a_gait_window_reaching_past_the_recording_is_cut_to_it(walking):
    served, _ = walking

    status, body = gait_of(served, "worlds=0&start=0.4&end=100")

    answer = json.loads(body)
    assert status == 200
    assert answer["window"] == [0.4, 0.792] and answer["frames"] == 50
    assert min(s[0] for leg in answer["worlds"][0]["stance"] for s in leg) >= 0.4


def test_a_model_without_a_fly_says_there_is_no_gait_and_why(viewed):
    served, _ = viewed  # the tiny model: a torso, an arm, a piston

    status, body = gait_of(served, "worlds=0")

    message = one_line_error(status, body)
    assert status == 400
    assert message.startswith("No gait: the model has no thorax named as a flygym fly's")
    assert "Its bodies: 'torso', 'arm'" in message


def test_an_archive_without_a_model_says_there_is_no_gait_and_how_to_give_one(tmp_path):
    from flyarchive.errors import SelectionError
    from flyarchive.testing import tiny_model
    from flyarchive.testing.fixtures import record
    from flyarchive.view.app import Viewer

    url = record(tiny_model(), str(tmp_path / "no-model.zarr"), store_model=False)
    viewer = Viewer(url, out=tmp_path / "videos", backend="cpu")

    with pytest.raises(SelectionError, match=r"^No gait: The archive at .* keeps no model.*"
                                             r"--model FILE"):
        viewer.gait({"worlds": "0"})


@pytest.fixture(scope="module")
def walking_tight(walker_url: str) -> Any:
    """The walker archive's viewer with small bounds: 150 frames of gait, 15,000 bytes of
    states read (a frame of one world: 25 values, 200 bytes), 8,000 bytes out."""
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    limits = Limits(max_gait_frames=150, max_read_bytes=15_000, max_out_bytes=8_000)
    with serving(walker_url, out=Path(walker_url).parent / "videos-tight", backend="opengl",
                 limits=limits) as found:
        yield found


@pytest.mark.parametrize("query, fragment", [
    ("worlds=0,1", "The gait would be 200 frames; one request may take at most 150"),
    ("worlds=0&end=0.6", "The states read for the gait would be 15,200 bytes"),  # 76 frames
    ("worlds=0&end=0.2", "The gait's answer would be 8,060 bytes"),  # 26 frames
])
def test_a_gait_request_past_a_bound_answers_413_before_anything_is_computed(walking_tight, query,
                                                                             fragment):
    served, log = walking_tight

    status, body = gait_of(served, query)

    message = one_line_error(status, body)
    assert status == 413 and fragment in message and "Show fewer worlds" in message
    assert len(served.viewer.gaits._kept) == 0  # nothing computed
    assert log.having("413 GET /api/gait")


@pytest.mark.parametrize("query, fragment", [
    ("x=nope&y=frequency", "No world variable 'nope' to plot on x. Numeric ones: 'world', "
                           "'n_frames', 'frequency', 'step_length'"),
    ("x=frequency&y=frequncy", "Did you mean 'frequency'?"),
    ("x=frequency&y=step_length&where=frequency = 6", "Use == to compare: frequency == 6"),
    ("x=frequency&y=step_length&where=speed > 1", "names 'speed', which is no world variable"),
])
def test_a_bad_scatter_request_answers_400_with_one_line(walking, query, fragment):
    served, log = walking

    status, _, body = ask_raw(f"{origin(served)}/api/scatter?{query.replace(' ', '%20')}",
                              headers=token_headers(served))

    assert status == 400 and fragment in one_line_error(status, body)
    untraced(log)


def test_a_scatter_of_text_is_refused(tmp_path, view_url):
    import flyarchive
    from flyarchive.errors import SelectionError
    from flyarchive.view.app import Viewer

    url = copy_archive(view_url, tmp_path / "run.zarr")
    flyarchive.add_world_vars(url, {"genotype": np.array(["wt", "mutA", "wt", "wt"])})
    viewer = Viewer(url, out=tmp_path / "videos", backend="cpu")

    with pytest.raises(SelectionError, match="'genotype' holds text; a scatter plots numbers"):
        viewer.scatter({"x": "genotype", "y": "distance"})


@pytest.mark.parametrize("body, fragment", [
    ({"worlds": [], "camera": "top"}, "Select at least one world"),
    ({"worlds": [0, 99], "camera": "top"}, "The archive has no world 99"),
    ({"worlds": list(range(20)), "camera": "front"}, "No camera 'front' in the model"),
    ({"worlds": [0, 1.5], "camera": "top"}, "worlds must hold whole numbers"),
    ({"worlds": [0], "camera": "top", "mosaic": True}, "A render request has no key 'mosaic'"),
])
def test_a_bad_render_of_brushed_worlds_queues_nothing(walking, body, fragment):
    served, _ = walking

    status, _, text = ask_raw(f"{origin(served)}/api/renders", method="POST", body=body,
                              headers=token_headers(served, **{"Content-Type": "application/json"}))

    assert status == 400 and fragment in one_line_error(status, text)
    assert served.viewer.renders.jobs == {}
