"""The GPU benchmark of issue 4, one run: recording overhead and archive -> mp4 replay.

Runs ``bench_gpu_record.py`` (sim steps/s of mujoco-warp with and without the
recorder, host RSS) and ``bench_gpu_replay.py`` (raw render limit, batch render,
archive -> mp4 end to end, flygym's ``render_trajectories_gpu``) on the same
device and model, prints both tables and a summary, and writes one JSON.

    python scripts/bench_gpu.py [--json PATH] [--device cuda|cpu] [--nworld 4096]
        [--steps 2000] [--worlds 128] [--frames 100] [--batch 1024] [--model nmf|tiny]
        [--only record|replay]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import json_path, positive_int, require_device  # noqa: E402  (beside this script)


def _run(script: str, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
        print("$", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd)
        if proc.returncode != 0 or not out.exists():
            return {"error": f"{script} exited with {proc.returncode}"}
        return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=json_path,
                   help="write the combined result as JSON to this path")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--model", choices=["nmf", "tiny"], default="nmf")
    p.add_argument("--nworld", type=positive_int, default=4096,
                   help="worlds simulated while recording")
    p.add_argument("--steps", type=positive_int, default=2000, help="timed sim steps")
    p.add_argument("--worlds", type=positive_int, default=128, help="worlds replayed")
    p.add_argument("--frames", type=positive_int, default=100, help="frames per replayed world")
    p.add_argument("--batch", type=positive_int, default=1024, help="states per render batch")
    p.add_argument("--only", choices=["record", "replay"])
    a = p.parse_args()
    require_device(p, a.device)
    common = ["--device", a.device, "--model", a.model]
    result: dict = {"device": a.device, "model": a.model}
    if a.only in (None, "record"):
        result["record"] = _run("bench_gpu_record.py",
                                [*common, "--nworld", str(a.nworld), "--steps", str(a.steps)])
    if a.only in (None, "replay"):
        result["replay"] = _run("bench_gpu_replay.py",
                                [*common, "--worlds", str(a.worlds), "--frames", str(a.frames),
                                 "--batch", str(a.batch)])
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    failed = [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
