"""Every example in README.md runs as written (issue 10, item 15).

The ```python blocks run in README order, each as a script of its own run as
``__main__`` in a fresh namespace, one after another in one process, in one temporary
folder (later blocks use what earlier ones wrote). Then the ```bash blocks
whose every command is a ``flyarchive`` command run there, one command at a time (the
first through the installed script, the others through its entry point in this process).
The S3 example talks to the moto server of the test session through the AWS profile
``lab`` that the fixture writes (``AWS_CONFIG_FILE``), as it would to AWS or MinIO.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from flyarchive import open_archive
from flyarchive.testing.markers import requires_flygym, requires_warp

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

pytestmark = [
    requires_flygym,
    requires_warp,
    pytest.mark.timeout(900),
    pytest.mark.slow,  # 1-3 minutes on 2 cores: two Dask clusters, flygym on Warp's CPU device
]


def readme_blocks(language: str) -> list[str]:
    return [code for lang, code in _BLOCK.findall(README.read_text()) if lang == language]


def cli_commands() -> list[str]:
    """The commands of the bash blocks made only of ``flyarchive`` commands."""
    commands = []
    for block in readme_blocks("bash"):
        lines = [line.split("  #")[0].strip() for line in block.splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        if lines and all(line.startswith("flyarchive ") for line in lines):
            commands += lines
    return commands


@pytest.fixture(scope="module")
def readme_env(tmp_path_factory, s3_server):
    """A folder and environment as a user's: flyarchive importable, an AWS profile ``lab``."""
    folder = tmp_path_factory.mktemp("readme")
    s3_server.create_bucket("lab")
    (folder / "aws-config").write_text(
        f"[profile lab]\nendpoint_url = {s3_server.endpoint_url}\nregion = us-east-1\n")
    (folder / "aws-credentials").write_text(
        "[lab]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(folder / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(folder / "aws-credentials"),
        PYTHONPATH=os.pathsep.join([str(README.parent), env.get("PYTHONPATH", "")]),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        MUJOCO_GL=env.get("MUJOCO_GL", "egl"),
    )
    return folder, env


#: Runs README python blocks one after another in one process, each as its own script run
#: as ``__main__`` in a fresh namespace (Dask's worker processes import it again, as they
#: would a script run with ``python``); after each block it writes that block's traceback
#: (None: it ran) to the results file, so a failure is reported for its block.
_RUNNER = """
import json, runpy, sys, traceback
results, scripts = sys.argv[1], sys.argv[2:]
done = []
for script in scripts:
    print(f"--- {script}", file=sys.stderr, flush=True)
    sys.argv = [script]
    try:
        runpy.run_path(script, run_name="__main__")
        error = None
    except SystemExit as stop:
        error = None if stop.code in (None, 0) else traceback.format_exc()
    except BaseException:
        error = traceback.format_exc()
    done.append(error)
    with open(results, "w") as out:
        json.dump(done, out)
"""


@pytest.fixture(scope="module")
def python_examples(readme_env):
    """Run every python block of the README in order, in one process (the imports of
    flygym, mujoco, xarray and dask cost seconds a process); each block's traceback, None
    where it ran. A process that dies in a block fails that block, and the blocks after
    it run in a new process."""
    folder, env = readme_env
    scripts = []
    for i, code in enumerate(readme_blocks("python")):
        scripts.append(f"readme_example_{i}.py")
        (folder / scripts[-1]).write_text(code)
    errors: list[str | None] = []
    while len(errors) < len(scripts):
        results = folder / "readme_results.json"
        results.unlink(missing_ok=True)
        run = subprocess.run([sys.executable, "-c", _RUNNER, results.name,
                              *scripts[len(errors):]],
                             cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        errors += json.loads(results.read_text()) if results.exists() else []
        if len(errors) < len(scripts):  # the process died in the next block
            errors.append(f"exit code {run.returncode}: {run.stderr[-3000:]}")
    return errors


def test_the_readme_has_python_and_cli_examples():
    assert len(readme_blocks("python")) >= 4
    assert len(cli_commands()) >= 5


def test_every_python_example_runs_as_written(python_examples):
    failed = [(i, error[-3000:]) for i, error in enumerate(python_examples) if error]

    assert not failed, failed


def test_the_examples_wrote_what_they_say(readme_env, python_examples):
    folder, _ = readme_env

    ds = open_archive(str(folder / "run.zarr"))
    manifest = json.loads((folder / "videos" / "manifest.json").read_text())

    assert dict(ds.sizes)["world"] == 4 and ds.n_frames.values.tolist() == [13] * 4
    assert sorted(v["world"] for v in manifest["videos"]) == [0, 3]
    assert open_archive(str(folder / "flygym.zarr")).n_frames.values.tolist() == [13]
    assert open_archive(str(folder / "flygym-gpu.zarr")).world.values.tolist() == [0, 3]


def test_the_query_example_rendered_windows_of_the_successful_worlds(readme_env,
                                                                    python_examples):
    folder, _ = readme_env

    videos = json.loads((folder / "query-videos" / "manifest.json").read_text())["videos"]

    assert videos and {v["world"] for v in videos} <= {0, 2}
    assert all(v["path"].endswith(".frames{:06d}-{:06d}.mp4".format(*v["frame_range"]))
               for v in videos)


def test_the_positions_example_found_the_farthest_worlds_and_tiled_them(readme_env,
                                                                         python_examples):
    folder, _ = readme_env

    ds = open_archive(str(folder / "run.zarr"))
    manifest = json.loads((folder / "farthest" / "manifest.json").read_text())

    farthest = ds.distance.sortby(ds.distance, ascending=False).world.values.tolist()
    assert (folder / "tarsus-heights.png").stat().st_size > 0
    assert [v["path"].split("/")[-2] for v in manifest["videos"]] == ["mosaic000"]
    assert manifest["videos"][0]["mosaic"]["worlds"] == farthest


def test_the_gait_example_put_tracked_and_simulated_flies_in_one_step_table(readme_env,
                                                                          python_examples):
    import pandas as pd

    folder, _ = readme_env

    steps = pd.read_csv(folder / "all-steps.csv")

    assert {"fly0", "world0", "world1"} <= set(steps.individual)
    assert set(steps.leg) == {"lf", "lm", "lh", "rf", "rm", "rh"}
    assert (steps.groupby("individual").size() >= 12).all()


def test_every_cli_example_runs_as_written(readme_env, python_examples, monkeypatch):
    """The first command runs through the installed ``flyarchive`` script in a shell; the
    others through the same entry point in this process (the same argv, folder and
    environment; a process each would cost seconds of imports)."""
    from flyarchive.cli import main

    folder, env = readme_env
    first, *others = cli_commands()
    result = subprocess.run(first, shell=True, cwd=folder, env=env, capture_output=True,
                            text=True, timeout=600)
    failed = [(first, result.stderr[-2000:])] if result.returncode else []
    monkeypatch.chdir(folder)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    for command in others:
        argv = shlex.split(command)
        assert argv[0] == "flyarchive", command
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(argv[1:])
        if code:
            failed.append((command, err.getvalue()[-2000:]))

    assert not failed, failed


def test_the_readme_s_metadata_makes_nwb_files_that_pass_nwbinspector(readme_env, python_examples,
                                                                     tmp_path):
    """``export-poses walk.zarr --format nwb --metadata meta.yaml``, as the CLI example runs it."""
    from nwbinspector import Importance, inspect_all

    from flyarchive.interop.poses import export_poses

    folder, _ = readme_env

    written = export_poses(str(folder / "walk.zarr"), tmp_path / "nwb", format="nwb",
                           metadata=folder / "meta.yaml")

    found = [m for m in inspect_all(str(tmp_path / "nwb"), progress_bar=False)
             if m.importance in (Importance.CRITICAL, Importance.BEST_PRACTICE_VIOLATION)]
    assert len(written) == 2 and not found, [m.message for m in found]
