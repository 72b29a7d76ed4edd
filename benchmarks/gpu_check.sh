#!/usr/bin/env bash
# Accelerator check, under five minutes on one GPU: fused (cuDNN) vs reference attention in
# bf16 for every scalar and learned policy, a 100-step bf16 training run, ensemble tokens/s for
# K = 1, 2, 4, 8, 16 members of the accelerator base model, MFU of a GPT-2-small-sized model,
# the device's idle fraction between steps and the sweep runner with 1 and 8 steps per program
# (benchmarks/gpu_check.py). Output goes to stdout and to
# benchmarks/results/gpu_check_<device>_<date>.txt; the throughput table that
# `python -m scale_ablation.sweep ... --plan` reads to benchmarks/results/throughput_<device>.json.
#   bash benchmarks/gpu_check.sh --tiny     # every part on tiny models, seconds, any device
#   bash benchmarks/gpu_check.sh            # installs .[cuda12] into .venv if jax sees no GPU
#   PYTHON=python3 bash benchmarks/gpu_check.sh   # an interpreter that already has a GPU jax
#                                                  # (a machine without network), no venv
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  PYTHON=.venv/bin/python
  if [ ! -x "$PYTHON" ]; then
    python3 -m venv .venv
  fi
  if ! "$PYTHON" -c "import jax, sys; sys.exit(jax.devices()[0].platform != 'gpu')" 2>/dev/null \
     && command -v nvidia-smi >/dev/null; then
    .venv/bin/pip install --quiet -e '.[cuda12]'
  fi
fi
mkdir -p benchmarks/results
device=$("$PYTHON" -c "import jax; print(jax.devices()[0].device_kind.replace(' ', '_'))")
out="benchmarks/results/gpu_check_${device}_$(date +%Y-%m-%d).txt"
case " $* " in *" --tiny "*) out="${out%.txt}_tiny.txt" ;; esac
WANDB_MODE=disabled "$PYTHON" -m benchmarks.gpu_check "$@" 2>&1 | tee "$out"
exit "${PIPESTATUS[0]}"
