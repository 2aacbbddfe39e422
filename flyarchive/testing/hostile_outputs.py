"""Hostile output folders: a render into them, and reads back from them, in child processes.

Used by ``scripts/reliability_report.py`` (the cases are tested one by one in
``tests/bad_input/test_output_folders.py``). Each case damages a copy of a rendered output
folder (a manifest linked to ``/dev/zero`` or made a FIFO, a world folder linked out of
the folder, a depth chunk linked to ``/dev/zero``...), then runs one operation on it
(``flyarchive render`` into it, ``read_depth``, ``read_segmentation``, ``read_video``) in a
child process capped at 2 GiB of address space and :data:`TIMEOUT_S` seconds. A case
passes when the child refused it with a flyarchive error, wrote nothing outside the output
folder (``followed``: a link was written or read through) and ended in time (``hung``).

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CASES", "TIMEOUT_S", "hostile_outputs_table", "run_case"]

#: Seconds a child may take (imports included) before it counts as hung.
TIMEOUT_S = 90.0
_MEMORY = 2 << 30
_SIZE = "48x64"


def _link_dev_zero(path: Path) -> None:
    _remove(path)
    os.symlink("/dev/zero", path)


def _fifo(path: Path) -> None:
    _remove(path)
    os.mkfifo(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _outside(out: Path, name: str) -> None:
    """Make ``out/name`` a link to the folder ``outside`` beside the output folder ``out``."""
    _remove(out / name)
    os.symlink(out.parent / "outside", out / name)


def _manifest(value: str) -> Callable[[Path], None]:
    def write(out: Path) -> None:
        (out / "manifest.json").write_text(value)

    return write


def _sparse(out: Path) -> None:
    with open(out / "manifest.json", "wb") as f:
        f.truncate(300 << 20)


_W = "world00000"
#: Case name -> (operation, damage done to a copy of the rendered output folder).
CASES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "manifest.json -> /dev/zero": ("render", lambda o: _link_dev_zero(o / "manifest.json")),
    "manifest.json is a FIFO": ("render", lambda o: _fifo(o / "manifest.json")),
    "manifest.json of 300 MiB": ("render", _sparse),
    "manifest nested 100,000 deep": ("render", _manifest("[" * 100_000 + "]" * 100_000)),
    "manifest entry without camera": ("render", _manifest(json.dumps(
        {"videos": [{"world": 0, "path": "x.mp4"}]}))),
    "world folder linked out of --out": ("render", lambda o: _outside(o, "world00001")),
    "mosaic folder linked out of --out": ("render-mosaic", lambda o: _outside(o, "mosaic000")),
    "map folder linked out (--overwrite)": ("render-maps", lambda o: _outside(
        o, f"{_W}/front.depth.zarr")),
    "depth chunk -> /dev/zero": ("read_depth", lambda o: _link_dev_zero(
        o / _W / "front.depth.zarr" / "c" / "0" / "0" / "0")),
    "depth chunk is a FIFO": ("read_depth", lambda o: _fifo(
        o / _W / "front.depth.zarr" / "c" / "0" / "0" / "0")),
    "segmentation zarr.json is a FIFO": ("read_segmentation", lambda o: _fifo(
        o / _W / "front.seg.zarr" / "zarr.json")),
    "video is a FIFO": ("read_video", lambda o: _fifo(o / _W / "front.mp4")),
    "video -> /dev/zero": ("read_video", lambda o: _link_dev_zero(o / _W / "front.mp4")),
}


def _rendered(work: Path) -> tuple[str, str, Path]:
    """An archive of 2 tiny worlds, its model file, and an output folder of world 0 with
    RGB, depth and segmentation."""
    from flyarchive.distribute.api import RenderOptions, render_videos
    from flyarchive.testing import TINY_XML, tiny_model
    from flyarchive.testing.fixtures import record

    model = work / "tiny.xml"
    model.write_text(TINY_XML)
    url = record(tiny_model(), str(work / "run.zarr"))
    out = work / "rendered"
    render_videos(url, tiny_model(), "front", str(out), worlds=[0], n_workers=0,
                  options=RenderOptions(size=(48, 64), outputs=("rgb", "depth", "segmentation")))
    return url, str(model), out


def run_case(name: str, url: str, model: str, rendered: Path, workdir: Path) -> dict[str, Any]:
    """Damage a copy of ``rendered`` as case ``name`` says and run its operation in a child.

    Returns:
        ``case``, ``operation``, ``error_type`` (None: it worked), ``message``,
        ``followed`` (something was written outside the folder, or a device was read:
        out of memory), ``hung`` (killed after :data:`TIMEOUT_S`), ``passed``.
    """
    operation, damage = CASES[name]
    out = workdir / "out"
    shutil.copytree(rendered, out, symlinks=True)
    (workdir / "outside").mkdir()
    damage(out)
    argv = [sys.executable, "-m", "flyarchive.testing.hostile_outputs", operation, url, model,
            str(out)]
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "MALLOC_ARENA_MAX": "2"}
    row: dict[str, Any] = {"case": name, "operation": operation, "error_type": None,
                           "message": "", "hung": False}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                              preexec_fn=_cap)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        row.update(json.loads(lines[-1]) if lines else
                   {"error_type": "died", "message": done.stderr.strip()[-300:]})
    except subprocess.TimeoutExpired:
        row.update(hung=True, message=f"did not finish within {TIMEOUT_S} s (killed)")
    row["followed"] = any((workdir / "outside").iterdir()) or row["error_type"] in (
        "MemoryError", "died")
    row["passed"] = bool(row["error_type"]) and row["error_type"] not in (
        "MemoryError", "died") and not row["hung"] and not row["followed"]
    return row


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY, _MEMORY))


def hostile_outputs_table(workdir: Path, *, progress: Callable[[str], None] | None = None
                          ) -> list[dict[str, Any]]:
    """Every case of :data:`CASES`, each on its own copy of one rendered output folder."""
    url, model, rendered = _rendered(workdir)
    rows = []
    for i, name in enumerate(CASES):
        case = workdir / f"case-{i}"
        case.mkdir()
        rows.append(run_case(name, url, model, rendered, case))
        if progress:
            row = rows[-1]
            progress(f"  hostile output {name}: {row['error_type']} hung={row['hung']} "
                     f"followed={row['followed']} {row['message'][:160]!r}")
    return rows


def _child(operation: str, url: str, model: str, out: str) -> dict[str, Any]:
    """Run one operation (in the child); its error, as JSON-friendly values."""
    try:
        if operation.startswith("render"):
            from flyarchive.cli import main

            extra = {"render": [], "render-mosaic": ["--mosaic", "1x2"],
                     "render-maps": ["--outputs", "rgb,depth", "--overwrite"]}[operation]
            said = io.StringIO()
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                code = main(["render", url, "--model", model, "--camera", "front", "--size",
                             _SIZE, "--out", out, "--workers", "0", "--quiet", *extra])
            return {"error_type": "FlyarchiveError" if code == 2 else None,
                    "message": said.getvalue().strip()[:1000]}
        from flyarchive.video import decode

        path = {"read_depth": "world00000/front.depth.zarr",
                "read_segmentation": "world00000/front.seg.zarr",
                "read_video": "world00000/front.mp4"}[operation]
        getattr(decode, operation)(os.path.join(out, path), root=out)
        return {"error_type": None}
    except BaseException as err:  # noqa: BLE001 - reported to the parent, whatever it is
        return {"error_type": type(err).__name__, "message": str(err)[:1000]}


def main(argv: list[str] | None = None) -> int:
    """``python -m flyarchive.testing.hostile_outputs OPERATION URL MODEL OUT`` (the child),
    or with no arguments: every case, printed as JSON."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print(json.dumps(_child(*args)))
        return 0
    with tempfile.TemporaryDirectory(prefix="flyarchive-hostile-outputs-") as tmp:
        rows = hostile_outputs_table(Path(tmp))
    print(json.dumps(rows, indent=2))
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
