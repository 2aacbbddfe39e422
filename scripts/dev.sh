#!/usr/bin/env bash
# Set up everything on a fresh machine, then run the demo or the tests.
#   bash scripts/dev.sh demo [flyarchive demo options]   # the main job, embedded defaults
#   bash scripts/dev.sh test [pytest options]            # the test suite (what CI runs)
#   bash scripts/dev.sh test --fast [pytest options]     # the cheap tier: no cluster, process,
#                                                        # Warp, flygym, S3, browser or install
# Creates .venv (Python >= 3.12) and installs flyarchive with all extras into it.
set -euo pipefail
cd "$(dirname "$0")/.."

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

setup() {
  local stamp=.venv/.flyarchive-installed
  if [ ! -x .venv/bin/python ]; then
    "$(find_python)" -m venv .venv
  fi
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[all,test]'
    touch "$stamp"
  fi
  ensure_egl
  ensure_chromium
}

cmd=${1:-}
shift || true
export MUJOCO_GL=${MUJOCO_GL:-egl}
case "$cmd" in
  demo)
    setup
    exec .venv/bin/flyarchive demo --overwrite "$@" ;;
  test)
    setup
    # Bytecode is kept (pytest's rewritten test modules, flyarchive's modules): without it
    # every run, and every process a test starts, compiles them again.
    unset PYTHONDONTWRITEBYTECODE
    # Worker processes (pytest-xdist), one test file per worker at a time: many tests wait
    # on the processes they start. FLYARCHIVE_TEST_PROCESSES=0 runs everything here.
    exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 \
      -n "${FLYARCHIVE_TEST_PROCESSES:-3}" --dist loadscope "$@" ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test [options]" >&2; exit 2 ;;
esac
