"""The child side of :mod:`flyarchive.store.model_check`: load untrusted MJB bytes once,
in a process of its own, and say how far it got.

Run as a script, isolated (``python -I model_child.py MEMORY_BYTES CPU_SECONDS``), never
imported by the product: it imports only the standard library and MuJoCo, so that nothing
of the caller's folder or environment is imported beside them. It limits its own address
space to ``MEMORY_BYTES`` and its CPU time to ``CPU_SECONDS`` (or less, where its limits
are lower already: it ends even if its parent was killed) and writes no core file, then
reads the MJB bytes from stdin and runs the stages replay runs, in order:

- ``load``: ``MjModel`` from the bytes (in memory: no file, no ``MUJOCO_LOG.TXT``);
- ``data``: ``MjData`` of the model;
- ``kinematics``: the position stages of replay (``mj_kinematics``, ``mj_comPos``,
  ``mj_camlight``, ``mj_tendon``; no ``mj_forward``), as
  :func:`flyarchive.replay.kinematics.update_render_geometry`;
- ``scene``: ``mjv_updateScene``, the CPU side of drawing a frame.

Before each stage it prints ``{"stage": NAME}`` (flushed); at the end one line
``{"verdict": "ok"}``, or ``{"verdict": "refused", "stage", "error", "message"}`` when
MuJoCo raised. A crash (a signal) or a kill shows as the last stage printed. Exit status
0 in every case it could report.
"""

import json
import resource
import sys


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> int:
    memory, seconds = int(sys.argv[1]), int(sys.argv[2])
    for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, seconds),
                         (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(limit)[1]
        if hard != resource.RLIM_INFINITY:  # a process may lower its limit, never raise it
            value = min(value, hard)
        resource.setrlimit(limit, (value, value))
    import mujoco

    blob = sys.stdin.buffer.read()
    warnings: list[str] = []
    mujoco.set_mju_user_warning(warnings.append)  # not to MUJOCO_LOG.TXT
    stage = "load"
    try:
        _say(stage=stage)
        model = mujoco.MjModel.from_binary_path("model.mjb", assets={"model.mjb": blob})
        stage = "data"
        _say(stage=stage)
        data = mujoco.MjData(model)
        stage = "kinematics"
        _say(stage=stage)
        for step in (mujoco.mj_kinematics, mujoco.mj_comPos, mujoco.mj_camlight,
                     mujoco.mj_tendon):
            step(model, data)
        stage = "scene"
        _say(stage=stage)
        scene = mujoco.MjvScene(model, maxgeom=1000)
        mujoco.mjv_updateScene(model, data, mujoco.MjvOption(), None, mujoco.MjvCamera(),
                               mujoco.mjtCatBit.mjCAT_ALL, scene)
    except Exception as err:  # noqa: BLE001 - reported to the parent, whatever it is
        reason = "; ".join(w.strip() for w in warnings) or str(err)
        _say(verdict="refused", stage=stage, error=type(err).__name__, message=reason[:2000])
        return 0
    _say(verdict="ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
