"""Hostile archives: an adversary's files, and what each command does with them.

Used by ``tests/test_hostile.py`` and ``scripts/reliability_report.py``. Each case of
:data:`CASES` turns a copy of a small sound archive into a hostile one: a chunk that
decodes to gigabytes, a chunk that is a FIFO or a link to ``/dev/zero``, metadata
nested 200,000 deep... :func:`run_isolated` runs one command on it in a child
process (``python -m flyarchive.testing.hostile``) under an address-space limit and a
timeout, so a regression fails (``MemoryError``, timeout) instead of exhausting the
machine or hanging, and reports what happened: exit status, error, seconds inside the
command, and the child's peak resident memory (``ru_maxrss``).

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from flyarchive.testing.holes import INCONSISTENT_CASES, MISSING_CASES

__all__ = [
    "CASES", "COMMANDS", "Outcome", "make_sound", "make_case", "command_argv", "run_isolated",
    "run_isolated_many",
    "hostile_table", "passed", "MAX_SECONDS", "MAX_MB", "pcodec_bomb", "rewrite_shard",
    "snapshot", "unpickled_marker", "run_caught", "BOMB_BYTES", "MEMORY_CAP",
]

#: What every bomb decodes to, bytes: well above :data:`MEMORY_CAP` (4 GiB).
BOMB_BYTES = 4 << 30
#: Address-space limit of the child that runs a command, bytes (a normal command peaks
#: near 1.2 GB of address space and 0.2 GB resident).
MEMORY_CAP = 3 << 30
#: Commands :func:`run_isolated` knows: the CLI's, and ``open_archive`` (the API, loading
#: everything).
COMMANDS = ("info", "verify", "open_archive", "export-npz", "plot", "render")


def make_sound(url: str) -> str:
    """Record a small sound archive: 2 worlds of the tiny model, 20 frames, chunks of 5."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    with TrajectoryRecorder(url, model, chunk_frames=5) as recorder:
        simulate(model, 2, 76, recorder.record_as_needed)
    return url


# ----------------------------------------------------------------------------- building blocks
def _meta(root: Path, name: str) -> tuple[Path, dict]:
    path = root / name / "zarr.json" if name else root / "zarr.json"
    return path, json.loads(path.read_text())


def _crc(data: bytes) -> bytes:
    import google_crc32c

    return np.uint32(google_crc32c.value(data)).tobytes()


def pcodec_bomb(n_bytes: int = BOMB_BYTES) -> bytes:
    """Standalone pcodec data of float64 zeros that decodes to ``n_bytes`` (in kilobytes).

    pcodec stores 2**18 equal values in a 33-byte chunk; the bomb repeats that chunk.
    """
    from numcodecs.pcodec import PCodec

    one = PCodec(level=8, delta_spec="try_lookback").encode(np.zeros(1 << 18))
    header, body, end = one[:12], one[12:-1], one[-1:]
    return header + body * max(1, n_bytes // (8 << 18)) + end


def rewrite_shard(path: Path, n_inner: int, replace: dict[int, bytes]) -> None:
    """Replace inner chunks of a shard (pcodec + crc32c, index at the end) by new pcodec
    data, with valid checksums, so that only decoding can tell them apart."""
    data = path.read_bytes()
    table = np.frombuffer(data[-(n_inner * 16 + 4):-4], "<u8").reshape(n_inner, 2)
    chunks = [data[int(o):int(o + n)] for o, n in table]
    for i, payload in replace.items():
        chunks[i] = payload + _crc(payload)
    offsets = np.cumsum([0] + [len(c) for c in chunks[:-1]])
    index = np.stack([offsets, [len(c) for c in chunks]], axis=1).astype("<u8").tobytes()
    path.write_bytes(b"".join(chunks) + index + _crc(index))


def _gzip_bomb(root: Path) -> None:
    """n_frames: metadata names gzip; a chunk of ~4 MB decodes to 4 GiB."""
    path, meta = _meta(root, "n_frames")
    meta["codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}},
                      {"name": "gzip", "configuration": {"level": 9}}]
    path.write_text(json.dumps(meta))
    member = gzip.compress(bytes(64 << 20), compresslevel=9)  # gzip members concatenate
    (root / "n_frames" / "c" / "0").write_bytes(member * (BOMB_BYTES // (64 << 20)))


def _pcodec_bomb(root: Path) -> None:
    """qpos: the pipeline flyarchive writes, a shard whose first chunk declares 4 GiB."""
    rewrite_shard(root / "qpos" / "c" / "0" / "1" / "0", 2, {0: pcodec_bomb()})


def _huge_file(root: Path) -> None:
    """n_frames: a 4 GiB (sparse) chunk file where 20 bytes belong."""
    with open(root / "n_frames" / "c" / "0", "r+b") as f:
        f.truncate(BOMB_BYTES)


def _dev_zero(root: Path) -> None:
    chunk = root / "qpos" / "c" / "0" / "1" / "0"
    chunk.unlink()
    chunk.symlink_to("/dev/zero")


def _fifo(root: Path) -> None:
    chunk = root / "time" / "c" / "1"
    chunk.unlink()
    os.mkfifo(chunk)


def _huge_chunk_shape(root: Path) -> None:
    path, meta = _meta(root, "n_frames")
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [10**12]
    path.write_text(json.dumps(meta))


def _deep_attrs(root: Path) -> None:
    path, meta = _meta(root, "")
    meta["attributes"]["notes"] = "DEEP"
    path.write_text(json.dumps(meta).replace('"DEEP"', "[" * 200_000 + "]" * 200_000))


def _attr(name: str, value: object) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        path, meta = _meta(root, "")
        meta["attributes"][name] = value
        path.write_text(json.dumps(meta))

    return edit


def _zstd_labels(root: Path) -> None:
    """dof labels: a zstd frame whose header declares 4 GiB (64 MiB of zeros inside)."""
    from numcodecs.zstd import Zstd

    frame = bytearray(Zstd(level=1).encode(bytes(64 << 20)))
    descriptor = frame[4]
    assert descriptor >> 6 == 2 and not (descriptor >> 5) & 1 and not descriptor & 3
    frame[6:10] = (BOMB_BYTES - 1).to_bytes(4, "little")  # after the window descriptor
    (root / "dof" / "c" / "0").write_bytes(bytes(frame))


def _zarr_v2_pickle(root: Path) -> None:
    """The archive as zarr v2: qpos's compressor is pickle; a chunk holds a pickle that
    would make a folder."""
    path, meta = _meta(root, "")
    (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (root / ".zattrs").write_text(json.dumps(meta["attributes"]))
    path.unlink()
    qpos, meta = _meta(root, "qpos")
    (root / "qpos" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": meta["shape"], "chunks": [2, 5, 13], "dtype": "<f8",
        "compressor": {"id": "pickle"}, "filters": None, "fill_value": "NaN", "order": "C",
        "dimension_separator": "/"}))
    dims = {"_ARRAY_DIMENSIONS": ["world", "time", "dof"]}
    (root / "qpos" / ".zattrs").write_text(json.dumps(dims))
    qpos.unlink()
    shutil.rmtree(root / "qpos" / "c")
    (root / "qpos" / "0" / "0").mkdir(parents=True)
    (root / "qpos" / "0" / "0" / "0").write_bytes(_mkdir_pickle(root))


def _mkdir_pickle(root: Path) -> bytes:
    """Protocol-0 pickle bytes that call ``os.mkdir(<root>.unpickled)`` when unpickled."""
    return f"cos\nmkdir\n(V{root.parent / (root.name + '.unpickled')}\ntR.".encode()


def _pickle_codec(root: Path) -> None:
    """qpos names numcodecs.pickle, and a chunk holds a pickle that would make a folder."""
    path, meta = _meta(root, "qpos")
    meta["codecs"][0]["configuration"]["codecs"].insert(0, {"name": "numcodecs.pickle"})
    path.write_text(json.dumps(meta))
    rewrite_shard(root / "qpos" / "c" / "0" / "0" / "0", 2, {0: _mkdir_pickle(root)})


def _flip(*parts: str) -> Callable[[Path], None]:
    def flip(root: Path) -> None:
        from flyarchive.testing import flip_bits

        flip_bits(root.joinpath(parts[0], "c", *parts[1:]))

    return flip


#: Hostile cases: name -> edit of a copy of :func:`make_sound`'s archive.
CASES: dict[str, Callable[[Path], None]] = {
    "n_frames chunk: gzip, 4 MB -> 4 GiB": _gzip_bomb,
    "qpos chunk: pcodec, 4 GiB of zeros": _pcodec_bomb,
    "n_frames chunk file of 4 GiB": _huge_file,
    "qpos chunk -> /dev/zero": _dev_zero,
    "time chunk is a FIFO": _fifo,
    "n_frames chunk shape 10**12": _huge_chunk_shape,
    "attributes nested 200,000 deep": _deep_attrs,
    "codec attribute a string": _attr("codec", "lossless"),
    "layout attribute a string": _attr("layout", "joints"),
    "dof labels: zstd frame declaring 4 GiB": _zstd_labels,
    "qpos codec numcodecs.pickle": _pickle_codec,
    "zarr v2 archive, qpos compressor pickle": _zarr_v2_pickle,
    "flipped bits in a time chunk": _flip("time", "1"),
    "flipped bits in a qpos shard": _flip("qpos", "0", "1", "0"),
    # committed frames missing, and archives whose parts disagree (flyarchive.testing.holes)
    **{name: edit for name, (edit, _) in MISSING_CASES.items()},
    **INCONSISTENT_CASES,
}


def make_case(sound: str, name: str, target: Path) -> str:
    """Copy the sound archive to ``target`` and apply case ``name``; returns its URL."""
    shutil.copytree(sound, target, symlinks=True)
    CASES[name](target)
    return str(target)


def unpickled_marker(url: str) -> Path:
    """The folder a pickle case's payload would create if anything unpickled it."""
    root = Path(url)
    return root.parent / f"{root.name}.unpickled"


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root`` without following links or opening anything but small
    regular files: relative path -> bytes (regular files up to 16 MiB), else
    ``(kind, size, mtime_ns, link target)``."""
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode) and st.st_size <= 16 << 20:
            out[str(path.relative_to(root))] = path.read_bytes()
        else:
            target = os.readlink(path) if path.is_symlink() else None
            out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size,
                                                st.st_mtime_ns, target)
    return out


# ----------------------------------------------------------------------------- running
@dataclass
class Outcome:
    """What one command did with one archive.

    Attributes:
        exit: Exit status: 0 ok, 1 verify found problems or an uncaught error, 2 a
            flyarchive error, None when the child was killed (timeout) or died.
        error_type: The exception's class for ``open_archive``; ``"FlyarchiveError"`` for
            a CLI exit 2; the uncaught exception's class; None when it worked.
        message: The error message (CLI: stderr), or what went wrong with the child.
        seconds: Time inside the command (after imports), s; None if it never ended.
        wall_s: Wall time of the child process, imports included, s.
        maxrss_mb: The child's peak resident memory, MiB; None if it never ended.
    """

    exit: int | None
    error_type: str | None
    message: str
    seconds: float | None
    wall_s: float
    maxrss_mb: float | None

    def to_json(self) -> dict:
        return asdict(self)


def command_argv(command: str, url: str, workdir: Path) -> list[str]:
    """The CLI arguments of ``command`` on ``url`` (outputs under ``workdir``)."""
    if command in ("info", "verify"):
        return [command, url]
    if command == "export-npz":
        return [command, url, "--to", str(workdir / "npz")]
    if command == "plot":
        return [command, url, "--world", "0", "--out", str(workdir / "plot.png")]
    if command == "render":
        from flyarchive.testing import TINY_XML

        model = workdir / "tiny.xml"
        model.write_text(TINY_XML)
        return [command, url, "--model", str(model), "--camera", "front", "--size", "48x64",
                "--out", str(workdir / "videos"), "--workers", "0", "--quiet"]
    raise ValueError(f"Unknown command {command!r}; known: {COMMANDS}.")


def _warm(commands: Sequence[str]) -> None:
    """Import the modules of ``commands`` and load xarray's backends (and for ``plot``
    matplotlib's fonts): one-time start-up work (about 1.2 s of it here)."""
    import dask.array  # noqa: F401
    import xarray

    import flyarchive.cli  # noqa: F401
    import flyarchive.interop.flygym_npz  # noqa: F401
    import flyarchive.store.integrity  # noqa: F401
    import flyarchive.summary  # noqa: F401

    xarray.backends.list_engines()
    if "plot" in commands:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure = plt.figure()
        figure.text(0.5, 0.5, "warm-up")
        figure.canvas.draw()
        plt.close(figure)
    if "render" in commands:
        import flyarchive.distribute.api  # noqa: F401
        import flyarchive.render.opengl  # noqa: F401


def _child(command: str, argv: list[str]) -> dict:
    """Run one command here (in the child); what happened, as JSON-friendly values.

    The command's modules are imported first (:func:`_warm`), so that ``seconds`` times
    the command, not one-time start-up work.
    """
    _warm([command])
    start = time.perf_counter()
    if command == "open_archive":
        from flyarchive import open_archive

        done = run_caught(lambda: open_archive(argv[0]).load())
    else:
        done = run_caught(argv)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**done, "seconds": seconds, "maxrss_mb": rss}


def run_caught(command: Sequence[str] | Callable[[], object]) -> dict:
    """Run here a CLI command (its arguments) or an API call (a function), whatever it
    raises; what it did, as JSON-friendly values.

    Returns:
        ``exit``: the CLI's exit status, or 0 for an API call that returned; 2 for a
        flyarchive error, 1 for any other exception. ``error_type``: the exception's
        class, ``"FlyarchiveError"`` for a CLI exit 2, None when it worked. ``message``:
        the CLI's stderr, or the exception's message.
    """
    stderr = io.StringIO()
    error_type, code = None, 0
    try:
        if callable(command):
            command()
        else:
            from flyarchive.cli import main

            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                code = main(list(command))
            error_type = "FlyarchiveError" if code == 2 else None
    except BaseException as err:  # noqa: BLE001 - reported to the parent, whatever it is
        from flyarchive.errors import FlyarchiveError

        code = 2 if isinstance(err, FlyarchiveError) else 1
        error_type = type(err).__name__
        stderr.write(str(err)[:2000])
    return {"exit": code, "error_type": error_type, "message": stderr.getvalue().strip()}


def run_isolated(command: str, url: str, workdir: Path, *, memory_bytes: int = MEMORY_CAP,
                 timeout_s: float = 60.0) -> Outcome:
    """Run ``command`` on ``url`` in a child process limited to ``memory_bytes`` of address
    space and ``timeout_s`` seconds (then killed).

    Args:
        command: One of :data:`COMMANDS`.
        url: The archive.
        workdir: Folder for the command's outputs (created).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [url] if command == "open_archive" else command_argv(command, url, workdir)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "flyarchive.testing.hostile", command, *argv],
            capture_output=True, text=True, timeout=timeout_s, preexec_fn=limit, env=_env(),
        )
    except subprocess.TimeoutExpired:
        return Outcome(None, None, f"did not finish within {timeout_s} s (killed)", None,
                       time.perf_counter() - start, None)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return Outcome(None, None, f"the child died (exit {done.returncode}): "
                       f"{done.stderr.strip()[-500:]}", None, wall, None)
    return Outcome(wall_s=wall, **json.loads(lines[-1]))


def run_isolated_many(jobs: Sequence[tuple[str, str, Path]], *,
                      memory_bytes: int = MEMORY_CAP, timeout_s: float = 60.0,
                      warm: str | None = None) -> list[Outcome]:
    """:func:`run_isolated` for each ``(command, url, workdir)`` of ``jobs``, through one
    child process that imports once and forks a process per job, capped at ``memory_bytes``
    of address space and killed after ``timeout_s`` (:func:`flyarchive.testing.forks.run_forked`).

    Each job runs in an address space of its own, as with :func:`run_isolated`; ``wall_s``
    is its forked process's, and ``maxrss_mb`` counts what that process shares with the
    child it was forked from (use :func:`run_isolated` to measure memory).

    Args:
        warm: A sound archive (:func:`make_sound`) the child reads first with ``info``,
            ``open_archive`` and ``verify``, so that first-use work is done once.
    """
    from flyarchive.testing.forks import run_forked

    todo = []
    for command, url, workdir in jobs:
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [url] if command == "open_archive" else command_argv(command, url, workdir)
        todo.append({"command": command, "argv": argv})
    warming = [{"command": c, "argv": [warm] if c == "open_archive" else [c, warm]}
               for c in ("info", "open_archive", "verify")] if warm else []
    done = run_forked("flyarchive.testing.hostile", todo, memory_bytes=memory_bytes,
                      timeout_s=timeout_s, warm=warming, env=_env())
    return [Outcome(wall_s=d["wall_s"], **d["result"]) if "result" in d
            else Outcome(None, None, d["died"], None, d["wall_s"], None) for d in done]


def _env() -> dict[str, str]:
    """The environment of a child that runs commands: few malloc arenas (a smaller address
    space under the cap), EGL for rendering."""
    return {**os.environ, "MALLOC_ARENA_MAX": "2",
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


#: Bounds every command must keep on a hostile archive: seconds inside the command, MiB.
MAX_SECONDS, MAX_MB = 2.0, 512.0


def passed(outcome: Outcome) -> bool:
    """True when a command refused cleanly (exit 2, or verify's exit 1 listing problems)
    or worked, within :data:`MAX_SECONDS` and :data:`MAX_MB`."""
    clean = outcome.exit in (0, 2) or (outcome.exit == 1 and outcome.error_type is None)
    return (clean and outcome.seconds is not None and outcome.seconds < MAX_SECONDS
            and outcome.maxrss_mb is not None and outcome.maxrss_mb < MAX_MB)


def hostile_table(workdir: Path, *, commands: Sequence[str] = COMMANDS,
                  cases: Sequence[str] | None = None,
                  progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run every command on every hostile case, each in a capped child.

    Returns:
        One row per case: ``case``, ``outcomes`` (command -> :meth:`Outcome.to_json`),
        ``max_seconds``, ``max_mb``, ``unchanged`` (the archive's files after all commands
        equal those before), ``passed_off`` (for committed frames missing: the commands that
        read them and exited 0, passing the hole off as data) and ``passed`` (every command
        :func:`passed`, nothing passed off).
    """
    sound = make_sound(str(workdir / "sound.zarr"))
    rows = []
    for i, name in enumerate(cases or list(CASES)):
        url = make_case(sound, name, workdir / f"hostile-{i}.zarr")
        before = snapshot(Path(url))
        outcomes = {c: run_isolated(c, url, workdir / f"out-{i}-{c}") for c in commands}
        for command, outcome in outcomes.items():
            if progress:
                progress(f"  hostile {name} / {command}: exit {outcome.exit} "
                         f"{outcome.error_type or ''} {outcome.seconds} s {outcome.maxrss_mb} MiB "
                         f"{outcome.message[:160]!r}")
        seconds = [o.seconds for o in outcomes.values()]
        memory = [o.maxrss_mb for o in outcomes.values()]
        readers = MISSING_CASES[name][1] if name in MISSING_CASES else ()
        passed_off = [c for c in readers if c in outcomes and outcomes[c].exit == 0]
        rows.append({
            "case": name,
            "outcomes": {c: o.to_json() for c, o in outcomes.items()},
            "max_seconds": None if None in seconds else max(seconds),
            "max_mb": None if None in memory else max(memory),
            "unchanged": snapshot(Path(url)) == before,
            "passed_off": passed_off,
            "passed": all(passed(o) for o in outcomes.values()) and snapshot(Path(url)) == before
            and not passed_off,
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from flyarchive.testing.forks import FORKED, serve_forked

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [FORKED]:  # run_isolated_many's child
        _warm(COMMANDS)
        return serve_forked(lambda job: _child(job["command"], job["argv"]), argv[1:])
    parser = argparse.ArgumentParser(description="Run one command on an archive (child side).")
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    print(json.dumps(_child(args.command, list(args.args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
