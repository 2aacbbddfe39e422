"""The flyarchive command: each subcommand end to end, and its errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.cli import main
from flyarchive.cli.args import parse_size, parse_time, parse_worlds
from flyarchive.errors import SelectionError
from flyarchive.models import save_mjb
from flyarchive.testing.fixtures import record


@pytest.fixture
def archive(tiny, tmp_path):
    """2 tiny worlds, 7 frames each."""
    return record(tiny, str(tmp_path / "cli.zarr"), n_steps=24)


def test_info_json_describes_the_archive(archive, capsys):
    assert main(["info", archive, "--json"]) == 0

    info = json.loads(capsys.readouterr().out)
    assert (info["worlds"], info["frames_max"], info["nq"], info["nmocap"]) == (2, 7, 13, 1)
    assert info["codec"] == "lossless" and info["dtype"] == "float64"


def test_verify_passes_a_sound_archive(archive, capsys):
    assert main(["verify", archive]) == 0
    assert "14 committed frames read" in capsys.readouterr().out


def test_verify_fails_when_n_frames_is_inconsistent(archive, capsys):
    import zarr

    zarr.open_group(archive, mode="r+")["n_frames"][:] = [7, 99]

    assert main(["verify", archive]) == 1
    assert "outside 0..7" in capsys.readouterr().err


def test_export_then_import_round_trips(archive, model_xml, tmp_path):
    assert main(["export-npz", archive, "--to", str(tmp_path / "npz"), "--worlds", "0-1"]) == 0
    assert main(["import-npz", str(tmp_path / "npz"), "--to", str(tmp_path / "back.zarr"),
                 "--model", model_xml]) == 0

    np.testing.assert_array_equal(open_archive(str(tmp_path / "back.zarr")).qpos.values,
                                  open_archive(archive).qpos.values)


def test_render_writes_videos_from_an_mjb_model(tiny, archive, tmp_path):
    model = str(save_mjb(tiny, tmp_path / "tiny.mjb"))

    code = main(["render", archive, "--model", model, "--camera", "front", "--worlds", "1",
                 "--time", "0:0.02", "--size", "48x64", "--out", str(tmp_path / "v"),
                 "--workers", "0", "--quiet"])

    assert code == 0
    assert (tmp_path / "v" / "world00001" / "front.mp4").is_file()
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    (video,) = manifest["videos"]
    assert video["video"]["preset"] == "veryfast" and video["video"]["crf"] == 18


def test_render_takes_the_x264_preset_and_crf(tiny, archive, tmp_path):
    model = str(save_mjb(tiny, tmp_path / "tiny.mjb"))

    code = main(["render", archive, "--model", model, "--camera", "front", "--worlds", "1",
                 "--time", "0:0.02", "--size", "48x64", "--out", str(tmp_path / "v"),
                 "--workers", "0", "--quiet", "--preset", "ultrafast", "--crf", "23"])

    assert code == 0
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    (video,) = manifest["videos"]
    assert video["video"]["preset"] == "ultrafast" and video["video"]["crf"] == 23


@pytest.mark.parametrize("flag", [["--crf", "52"], ["--crf", "-1"], ["--preset", "fastest"]])
def test_bad_encoder_settings_are_refused_before_rendering(archive, tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as exit_:
        main(["render", archive, "--model", "m.xml", "--camera", "front", *flag])

    assert exit_.value.code == 2
    assert "argument --" + flag[0].lstrip("-") in capsys.readouterr().err


def test_plot_writes_a_png(archive, tmp_path):
    assert main(["plot", archive, "--world", "1", "--dof", "shoulder", "--out",
                 str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_missing_archive_is_a_clear_error_with_exit_code_2(tmp_path, capsys):
    assert main(["info", str(tmp_path / "none.zarr")]) == 2
    assert "flyarchive info: error: Nothing at" in capsys.readouterr().err


def test_missing_model_file_is_a_clear_error(archive, tmp_path, capsys):
    code = main(["render", archive, "--model", str(tmp_path / "no.xml"), "--camera", "front",
                 "--workers", "0"])

    assert code == 2
    assert "No model file at" in capsys.readouterr().err


def test_model_with_unknown_suffix_is_refused(archive, tmp_path, capsys):
    (tmp_path / "m.txt").write_text("x")

    assert main(["import-npz", str(tmp_path), "--to", str(tmp_path / "a.zarr"),
                 "--model", str(tmp_path / "m.txt")]) == 2
    assert "must be an MJCF .xml, a spec zip (.mjz, .zip) or a compiled .mjb" in capsys.readouterr().err


def test_world_ranges_parse():
    assert parse_worlds("0,3,10-12") == [0, 3, 10, 11, 12]


def test_an_open_world_range_takes_the_archives_ids_from_its_start():
    assert parse_worlds("0,512-", ids=[0, 3, 511, 512, 1024]) == [0, 512, 1024]


def test_export_npz_of_an_open_world_range_writes_those_worlds(archive, tmp_path, capsys):
    assert main(["export-npz", archive, "--to", str(tmp_path / "npz"), "--worlds", "1-"]) == 0

    assert "wrote 1 file(s)" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "npz").iterdir()) == ["world00001.npz"]


def test_time_window_takes_infinity_as_an_open_side():
    assert parse_time("0:inf") == (0.0, float("inf"))


def test_bad_world_selection_is_refused():
    with pytest.raises(SelectionError, match="ids and ranges like '0,3,10-20'"):
        parse_worlds("a-b")


def test_time_window_parses_open_ends():
    assert parse_time("0.5:") == (0.5, None)
    assert parse_time(":2") == (None, 2.0)


def test_bad_time_window_is_refused():
    with pytest.raises(SelectionError, match="START:END"):
        parse_time("2")


def test_size_parses_height_by_width():
    assert parse_size("240x320") == (240, 320)
    with pytest.raises(SelectionError, match="HEIGHTxWIDTH"):
        parse_size("240")


@pytest.mark.subprocess
def test_an_error_is_not_lost_while_warp_starting_in_a_thread_holds_stderr(tmp_path):
    # Warp's start on a machine without CUDA captures file descriptor 2 (to drop its
    # driver warning); the command's one-line error must still reach stderr when the
    # process exits while a daemon thread is inside that capture.
    code = (
        "import sys, threading, time, types\n"
        "import flyarchive.warp_log as log\n"
        "slow = types.SimpleNamespace(init=lambda: time.sleep(1.0))\n"
        "threading.Thread(target=log._init_without_cuda_warning, args=(slow,), daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "from flyarchive.cli import main\n"
        f"sys.exit(main(['render', {str(tmp_path / 'none.zarr')!r}, '--camera', 'c', "
        f"'--out', {str(tmp_path / 'out')!r}]))\n"
    )

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert done.returncode == 2
    assert "flyarchive render: error: Nothing at" in done.stderr



def _parsers(parser):
    """The parser and every subcommand's parser under it, each with its command path."""
    import argparse

    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_help_of_every_command_reads_as_plain_text_for_users():
    from flyarchive.cli.commands import build_parser

    parsers = dict(_parsers(build_parser()))
    texts = {prog: p.format_help() for prog, p in parsers.items()}

    assert len(texts) >= 14 and "flyarchive render" in texts
    markup = (":func:", ":mod:", ":class:", ":meth:", "``")
    assert {prog: [m for m in markup if m in text] for prog, text in texts.items()
            if any(m in text for m in markup)} == {}
    assert "into an xarray/zarr archive" in " ".join(texts["flyarchive"].split())


@pytest.mark.parametrize("command", [
    ["render", "--camera", "front", "--out", "videos", "--workers", "0"],
    ["export-npz", "--to", "npz"],
    ["gait", "--thorax", "torso", "--tip", "hand_tip=hand@tip"],
], ids=["render", "export-npz", "gait"])
def test_an_empty_worlds_option_is_refused_not_every_world(archive, tmp_path, cli, command,
                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    name, *rest = command

    code, _, err = cli(name, archive, *rest, "--worlds", "")

    assert code == 2 and "Cannot read worlds ''" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.zarr"]


def test_a_foreign_file_in_an_archives_folder_makes_no_warning_noise(archive):
    from pathlib import Path

    (Path(archive) / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")

    done = subprocess.run([sys.executable, "-m", "flyarchive", "verify", archive],  # the package
                          capture_output=True, text=True, timeout=120)          # runs as the CLI

    assert done.returncode == 0, done.stderr
    assert "not recognized" not in done.stderr and "Warning" not in done.stderr


@pytest.mark.parametrize(("command", "inside"), [
    (["render", "{url}", "--camera", "front", "--workers", "0", "--out", "{inside}"], "videos"),
    (["export-npz", "{url}", "--to", "{inside}"], ""),
    (["plot", "{url}", "--world", "0", "--out", "{inside}"], "traces.png"),
    (["gait", "{url}", "--thorax", "torso", "--tip", "hand_tip=hand@tip", "--steps", "{inside}"],
     "steps.csv"),
], ids=["render", "export-npz", "plot", "gait --steps"])
def test_outputs_inside_an_archives_folder_are_refused(archive, cli, command, inside):
    from pathlib import Path

    from flyarchive.testing.fixtures import snapshot

    target = str(Path(archive) / inside) if inside else archive
    before = snapshot(archive)

    code, _, err = cli(*[part.format(url=archive, inside=target) for part in command])

    assert code == 2 and f"is inside the archive (or zarr group) at '{archive}'" in err
    assert "a place outside it, e.g." in err
    assert snapshot(archive) == before


def test_a_time_window_starting_before_zero_is_read_without_an_equals_sign(archive, tmp_path,
                                                                           cli):
    code, _, err = cli("render", archive, "--camera", "front", "--workers", "0", "--worlds", "0",
                       "--time", "-1:0.008", "--size", "48x64", "--out", tmp_path / "v")

    assert code == 0, err
    assert len(json.loads((tmp_path / "v" / "manifest.json").read_text())["videos"]) == 1
