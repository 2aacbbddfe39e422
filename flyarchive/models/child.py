"""The child side of :mod:`flyarchive.models.check`: load an untrusted kept model once,
in a process of its own, and say how far it got.

Run as a script, isolated from the working folder and the environment's Python variables
(``python -I child.py MEMORY_BYTES CPU_SECONDS FORM SYS_PATH``), never imported by the
product: it imports the standard library, MuJoCo (found on ``SYS_PATH``, the caller's
import path as a JSON list, which replaces its own: packages that come from the caller's
``PYTHONPATH`` are found, the working folder is not searched) and, for a spec zip,
``spec_zip.py`` beside this file, loaded by its path (standard library only). It limits
its own address space to ``MEMORY_BYTES`` and its CPU time to ``CPU_SECONDS`` (or less,
where its limits are lower already: it ends even if its parent was killed) and writes no
core file, then reads the model's bytes from stdin and runs, in order:

- for ``FORM`` ``mjz`` (a spec zip): ``unpack`` (the zip read with bounds; its MJCF must
  name only files the zip holds: :func:`flyarchive.models.spec_zip.check_closed`), ``parse``
  (``MjSpec.from_string`` from memory) and ``compile``, which writes the compiled model's
  MJB to ``compiled.mjb`` in the working folder (a temporary folder of the parent's);
- ``load``: ``MjModel`` from the MJB bytes (the bytes read, or those just compiled: the
  stages below run on what the parent will load);
- ``data``: ``MjData`` of the model;
- ``kinematics``: the position stages of replay (``mj_kinematics``, ``mj_comPos``,
  ``mj_camlight``, ``mj_tendon``; no ``mj_forward``), as
  :func:`flyarchive.replay.kinematics.update_render_geometry`;
- ``scene``: ``mjv_updateScene``, the CPU side of drawing a frame.

Before each stage it prints ``{"stage": NAME}`` (flushed); at the end one line
``{"verdict": "ok"}``, or ``{"verdict": "refused", "stage", "error", "value", "message"}``
when something raised (``value``: the error is a ``ValueError``, how MuJoCo and the zip
reader refuse input cleanly). A crash (a signal) or a kill shows as the last stage printed.
Exit status 0 in every case it could report.
"""

import importlib.util
import json
import resource
import sys
from pathlib import Path


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _spec_zip_module():  # noqa: ANN202 - the module, loaded by its path
    path = Path(__file__).resolve().with_name("spec_zip.py")
    spec = importlib.util.spec_from_file_location("_flyarchive_spec_zip", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def main() -> int:
    memory, seconds, form = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, seconds),
                         (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(limit)[1]
        if hard != resource.RLIM_INFINITY:  # a process may lower its limit, never raise it
            value = min(value, hard)
        resource.setrlimit(limit, (value, value))
    sys.path[:] = [p for p in json.loads(sys.argv[4]) if isinstance(p, str) and p]
    import mujoco

    blob = sys.stdin.buffer.read()
    warnings: list[str] = []
    mujoco.set_mju_user_warning(warnings.append)  # not to MUJOCO_LOG.TXT
    stage = "load"
    try:
        if form == "mjz":
            stage = "unpack"
            _say(stage=stage)
            spec_zip = _spec_zip_module()
            files = spec_zip.read_spec_zip(blob)
            spec_zip.check_closed(files)
            stage = "parse"
            _say(stage=stage)
            spec = mujoco.MjSpec.from_string(files.xml.decode("utf-8"), assets=files.assets)
            stage = "compile"
            _say(stage=stage)
            compiled = spec.compile()
            mujoco.mj_saveModel(compiled, "compiled.mjb", None)
            blob = Path("compiled.mjb").read_bytes()
            del compiled, spec, files
            stage = "load"
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
        _say(verdict="refused", stage=stage, error=type(err).__name__,
             value=isinstance(err, ValueError), message=reason[:2000])
        return 0
    _say(verdict="ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
