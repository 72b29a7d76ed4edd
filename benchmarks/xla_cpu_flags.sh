#!/usr/bin/env bash
# The benchmark config's train step under XLA CPU flag sets (oneDNN, XNNPACK, YNNPACK, fast
# math), one process each: does another CPU code path close the MFU gap (issue 14)? A flag set
# this jaxlib does not know, or that fails to compile the step, prints no line.
#   bash benchmarks/xla_cpu_flags.sh | tee benchmarks/results/xla_cpu_flags_<machine>_<date>.txt
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
for flags in "" "--xla_cpu_use_onednn=true" "--xla_cpu_experimental_onednn_fusion_type=dot" \
    "--xla_cpu_use_xnnpack=true" "--xla_cpu_experimental_xnn_fusion_type=dot" \
    "--xla_cpu_experimental_ynn_fusion_type=dot" \
    "--xla_cpu_experimental_ynn_fusion_type=dot,elementwise,reduce" \
    "--xla_cpu_enable_fast_math=true"; do
  XLA_FLAGS="$flags" WANDB_MODE=disabled timeout 300 "$python" -c "
import os
from benchmarks import run as bench
step = bench.step_figures(bench.benchmark_config(), reps=5)
print(f'[{os.environ[\"XLA_FLAGS\"]}] step {step[\"train_step_seconds\"] * 1e3:.0f} ms, matmul '
      f'peak {step[\"matmul_peak_gflops\"]:.0f} GFLOP/s, MFU {step[\"train_mfu\"]:.3f}', flush=True)
" 2>/dev/null
done
