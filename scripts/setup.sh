#!/usr/bin/env bash
# Set up looprl on a fresh machine: system packages (bubblewrap), a venv, torch pinned to the
# CPU build where no NVIDIA GPU is present, and the package in editable mode.
# Usage: bash scripts/setup.sh [python] [venv-dir]
set -euo pipefail
PY="${1:-python3}"
VENV="${2:-.venv}"

# bubblewrap isolates sandboxed commands; a C compiler builds the one-exec sandbox launcher
# (src/looprl/sandbox/launch.py; without one, a slower chain of stock tools is used).
NEED=""
command -v bwrap >/dev/null 2>&1 || NEED="$NEED bubblewrap"
command -v cc >/dev/null 2>&1 || NEED="$NEED gcc libc6-dev"
# the dashboard's browser tests drive Debian's headless Chromium (Playwright's own browser
# download is not used: it needs a host that may be unreachable)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || NEED="$NEED chromium"
# the container sandbox backend's tests drive Podman with an image built from busybox here
# (nothing is pulled from a registry); a docker client without a daemon runs nothing
command -v podman >/dev/null 2>&1 || { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; } \
  || NEED="$NEED podman"
# Podman's default runtime (crun) refuses hosts with hybrid v1/v2 cgroups, where runc runs
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || NEED="$NEED runc"
command -v busybox >/dev/null 2>&1 || NEED="$NEED busybox-static"
if [ -n "$NEED" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing system packages:$NEED"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $NEED >/dev/null \
      || echo "[setup] WARNING: apt-get could not install:$NEED" >&2
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq >/dev/null && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $NEED >/dev/null \
      || echo "[setup] WARNING: apt-get could not install:$NEED" >&2
  else
    echo "[setup] WARNING: missing system packages:$NEED; install them with your package manager." \
         "Without bubblewrap sandboxed commands fail; without a C compiler they start slower." >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating venv $VENV"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip 2>/dev/null || true

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    echo "[setup] NVIDIA GPU found: installing the default torch build"
    "$VENV/bin/python" -m pip install -q "torch>=2.4"
  else
    # A bare `torch` would pull a multi-GB CUDA build; the pinned release has a CPU wheel.
    echo "[setup] no NVIDIA GPU: installing torch==2.13.0 (CPU)"
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  fi
fi
echo "[setup] installing looprl and its dependencies (with the ray extra: the fleet and its tests;"\
     "the test extra: playwright and wandb for the dashboard and logger tests)"
"$VENV/bin/python" -m pip install -q -e ".[ray,test]"
"$VENV/bin/python" -c "import looprl, torch; print('[setup] looprl ready, torch', torch.__version__)"
