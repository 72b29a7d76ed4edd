r"""The quick d_k sweep as a new user runs it, cold: wall time, compile share, disk (issue 56).

  python -m benchmarks.quick_sweep [--spec=experiments/dk_sweep.py:quick] [--out FILE.json]
      [--workdir DIR] [-- SWEEP_FLAGS ...]

Runs `python -m scale_ablation.sweep --config=SPEC --workdir=DIR/dk_sweep_quick --noreport`, then
the report, as `launch/local.sh` does, in a fresh directory, so that the compilation cache beside
it (`train.compilation_cache`) starts empty; W&B as for a user who is not logged in (offline).
Reports the wall seconds of each, the sweep's compile seconds (tracing, lowering and XLA, the
compile-ahead thread's included, as its own last line counts them) over its wall time, the
seconds by kind of program (`benchmarks.compile_kinds`), and what the directory holds on disk
(`du`): in all, and its checkpoints, compilation cache and W&B files apart. The load average
goes with them: on a shared 2-core machine the seconds move with it, the share much less.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks import run as bench

_SPEC = flags.DEFINE_string("spec", "experiments/dk_sweep.py:quick", "The sweep to run.")
_WORKDIR = flags.DEFINE_string("workdir", "", "A new directory to run in (default: a "
                               "temporary one, removed after); it must not exist.")


def du_kib(paths: list[str]) -> int:
    """Disk usage of `paths` in KiB, by `du` itself (0 for none)."""
    if not paths:
        return 0
    result = subprocess.run(["du", "-sck", *paths], capture_output=True, text=True, check=True)
    return int(result.stdout.strip().splitlines()[-1].split()[0])


def footprint(sweep_dir: str) -> dict:
    """MiB on disk: the directory in all, and its checkpoints, cache and W&B files."""
    runs = [os.path.join(sweep_dir, name) for name in sorted(os.listdir(sweep_dir))
            if os.path.isfile(os.path.join(sweep_dir, name, "config.json"))]

    def parts(name: str) -> list[str]:
        return [p for p in (os.path.join(run, name) for run in runs) if os.path.exists(p)]

    mib = lambda kib: round(kib / 1024, 1)  # noqa: E731
    return {"runs": len(runs), "total_mib": mib(du_kib([sweep_dir])),
            "checkpoints_mib": mib(du_kib(parts("checkpoints"))),
            # The sweep's cache: beside its runs (`runtime.enable_compilation_cache`).
            "compilation_cache_mib": mib(du_kib([p for p in [os.path.join(sweep_dir, ".jax_cache")]
                                                 if os.path.exists(p)])),
            "wandb_mib": mib(du_kib(parts("wandb"))),
            "report_mib": mib(du_kib([p for p in [os.path.join(sweep_dir, "report")]
                                      if os.path.exists(p)])),
            "checkpoint_steps_kept": sum(len(os.listdir(p)) for p in parts("checkpoints"))}


def timed(command: list[str], env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}"
                 f"\n{result.stderr[-3000:]}")
    return seconds, result.stdout


def measure(root: str, extra: list[str]) -> dict:
    sweep_dir, kinds_file = os.path.join(root, "dk_sweep_quick"), os.path.join(root, "kinds.json")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    sweep = [sys.executable, "-m", "scale_ablation.sweep", f"--config={_SPEC.value}",
             f"--workdir={sweep_dir}", "--noreport", *extra]
    load_before = bench.loadavg()
    sweep_s, stdout = timed([sys.executable, "-m", "benchmarks.compile_kinds", kinds_file,
                             *sweep[2:]], env)
    load_after_sweep = bench.loadavg()
    report_s, _ = timed([sys.executable, "-m", "scale_ablation.report", sweep_dir], env)
    found = bench.COMPILE_LINE.search(stdout)
    names = ("programs_compiled", "train_steps_compiled", "train_steps_compiled_ahead",
             "programs_from_cache", "compile_seconds", "compile_seconds_waited")
    compiled = dict(zip(names, (float(g) for g in found.groups()), strict=True))
    with open(kinds_file) as f:
        kinds = json.load(f)
    line = next(line for line in stdout.splitlines() if line.startswith("[sweep] compiled"))
    return {"command": " ".join(["python", *sweep[1:]]), "machine": bench.machine(),
            "loadavg_before": load_before, "loadavg_after_sweep": load_after_sweep,
            "loadavg_after_report": bench.loadavg(), "sweep_seconds": sweep_s,
            "report_seconds": report_s, **compiled,
            "compile_share": compiled["compile_seconds"] / sweep_s,
            "compile_waited_share": compiled["compile_seconds_waited"] / sweep_s,
            "compile_line": line, "by_kind": kinds["by_kind"],
            "disk": footprint(sweep_dir)}


def main(argv: list[str]) -> int:
    extra = argv[1:]
    if _WORKDIR.value:
        os.makedirs(_WORKDIR.value)  # a fresh one: its cache must start empty
        result = measure(_WORKDIR.value, extra)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = measure(tmp, extra)
    print(json.dumps(result, indent=2))
    out = flags.FLAGS.out  # benchmarks.run's --out, defined when it is imported
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    app.run(main)
