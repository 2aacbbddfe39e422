#!/usr/bin/env bash
# Set up everything on a fresh machine, then run the demo or the tests.
#   bash scripts/dev.sh demo [flyarchive demo options]   # the main job, embedded defaults
#   bash scripts/dev.sh test [pytest options]            # the test suite on MuJoCo 3.16
#   bash scripts/dev.sh test --fast [pytest options]     # the cheap tier: no cluster, process,
#                                                        # Warp, flygym, S3, browser or install
#   bash scripts/dev.sh test --mujoco 4 [--fast] [...]   # the same on MuJoCo 4.0.1
#   bash scripts/dev.sh setup [--mujoco 3|4]             # make an environment, run nothing
# CI runs `test`, then `test --mujoco 4 --fast` (.ci/run).
#
# Two environments, one per MuJoCo line flyarchive supports (Python >= 3.12 each):
#   .venv          MuJoCo 3.16, mujoco-warp 3.16, flygym 2.1 (which pins MuJoCo < 3.17):
#                  flyarchive with all extras;
#   .venv-mujoco4  MuJoCo 4.0.1, mujoco-warp 4.0.0: every extra but flygym.
# `test` makes both: the cross-release tests (tests/replay/test_releases.py) replay in
# one environment what the other recorded, through the interpreter named by
# FLYARCHIVE_TEST_OTHER_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

#: What each line installs: the pins beside flyarchive's extras.
MUJOCO3_VENV=.venv
MUJOCO3_EXTRAS='.[all,test]'
MUJOCO3_PINS=()
MUJOCO4_VENV=.venv-mujoco4
MUJOCO4_EXTRAS='.[gpu,s3,dask,plot,view,movement,nwb,test]'
MUJOCO4_PINS=('mujoco==4.0.1' 'mujoco-warp==4.0.0')

find_python() {
  local c
  for c in python3.12 python3.13 python3.14 python3 \
           "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  echo "dev.sh: no Python >= 3.12 found; install one (e.g. apt-get install python3.12 python3.12-venv)" >&2
  return 1
}

ensure_egl() {
  # Headless rendering needs an EGL library (Mesa's software rasterizer on CPU-only machines).
  if ! ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1'; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "dev.sh: installing Mesa EGL (libegl1, libgl1-mesa-dri, libgles2)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libgl1-mesa-dri libgles2 >/dev/null
    else
      echo "dev.sh: no libEGL.so.1 found; install Mesa's EGL (Debian: libegl1 libgl1-mesa-dri)" >&2
    fi
  fi
}

ensure_chromium() {
  # The viewer's browser tests drive Debian's Chromium through Playwright (tests/view).
  if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "dev.sh: installing Chromium (for the viewer's browser tests)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "dev.sh: no chromium found; the browser tests will be skipped (Debian: apt-get install chromium)" >&2
    fi
  fi
}

venv_of() {  # the environment folder of MuJoCo line $1
  case "$1" in 3) echo "$MUJOCO3_VENV" ;; 4) echo "$MUJOCO4_VENV" ;; esac
}

make_env() {
  # Make (or bring up to date) the environment of MuJoCo line $1, as a new user would
  # with pip. MuJoCo 4 split the `mujoco` package into `mujoco-core` and a metapackage;
  # pip, going from one side of the split to the other in place, removes files the other
  # side installed ("uninstall first", MuJoCo 4.0.0's changelog): an environment whose
  # MuJoCo is of the other line is emptied of MuJoCo first.
  local line=$1 venv extras pins wanted have
  venv=$(venv_of "$line")
  if [ "$line" = 3 ]; then extras=$MUJOCO3_EXTRAS; pins=("${MUJOCO3_PINS[@]}"); wanted=3
  else extras=$MUJOCO4_EXTRAS; pins=("${MUJOCO4_PINS[@]}"); wanted=4; fi
  local stamp=$venv/.flyarchive-installed
  if [ ! -x "$venv/bin/python" ]; then
    "$(find_python)" -m venv "$venv"
  fi
  have=$("$venv/bin/python" -c 'import importlib.metadata as m
for name in ("mujoco-core", "mujoco"):
    try:
        print(m.version(name).split(".")[0]); break
    except m.PackageNotFoundError:
        pass' 2>/dev/null || true)
  if [ -n "$have" ] && [ "$have" != "$wanted" ]; then
    echo "dev.sh: $venv has MuJoCo $have; uninstalling it before MuJoCo $wanted (the package split)"
    "$venv/bin/python" -m pip uninstall -q -y mujoco mujoco-core mujoco-studio mujoco-studio-wasm mujoco-warp
    rm -f "$stamp"
  fi
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e "$extras" ${pins[@]+"${pins[@]}"}
    touch "$stamp"
  fi
}

setup() {
  make_env "$1"
  ensure_egl
  ensure_chromium
}

cmd=${1:-}
shift || true
# --mujoco 3|4, anywhere among the options; the rest go to pytest or the demo.
line=3
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mujoco) line=${2:-}; shift 2 || shift ;;
    --mujoco=*) line=${1#--mujoco=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- ${args[@]+"${args[@]}"}
case "$line" in
  3) other=4 ;;
  4) other=3 ;;
  *) echo "dev.sh: --mujoco takes 3 (MuJoCo 3.16, with flygym) or 4 (MuJoCo 4.0.1), got '$line'" >&2; exit 2 ;;
esac
export MUJOCO_GL=${MUJOCO_GL:-egl}
case "$cmd" in
  setup)
    setup "$line" ;;
  demo)
    setup "$line"
    exec "$(venv_of "$line")/bin/flyarchive" demo --overwrite "$@" ;;
  test)
    # Both environments: the cross-release tests need the other line's interpreter.
    make_env "$other"
    setup "$line"
    export FLYARCHIVE_TEST_OTHER_PYTHON=$PWD/$(venv_of "$other")/bin/python
    # Bytecode is kept (pytest's rewritten test modules, flyarchive's modules): without it
    # every run, and every process a test starts, compiles them again.
    unset PYTHONDONTWRITEBYTECODE
    # Worker processes (pytest-xdist), one test file per worker at a time: many tests wait
    # on the processes they start. FLYARCHIVE_TEST_PROCESSES=0 runs everything here.
    exec "$(venv_of "$line")/bin/python" -m pytest -q -p no:cacheprovider --durations=15 \
      -n "${FLYARCHIVE_TEST_PROCESSES:-3}" --dist loadscope "$@" ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test|setup [--mujoco 3|4] [options]" >&2; exit 2 ;;
esac
