r"""Issue 56's "Done when" on a fixed slice of dk_exponent:cpu: the sweep with no flags (the
arrangement it picks from this CPU's table) against today's default, end to end:

    python -m benchmarks.arrangement_check [--qk_dims=16,64] [--init=fan_in] [--seed=0]
        [--workdir=DIR] [--out=FILE.json]

The slice is one init × the `--qk_dims` × every C and LR the study runs there × one seed (its
grid as `experiments/dk_exponent.py:cpu` gives it, written to an experiment file in the work
directory). It trains twice, each in a fresh sweep directory with a cold compilation cache:
first with today's default given explicitly (`--parallel=1 --max_members=0`: one process, a
group's runs as one program), then with no arrangement flags, so that the sweep picks from the
table (`scale_ablation.sweeping.arrangements`). Before the second, `--plan` prints its
estimate. The results file has both walls, the speedup (target ≥ 1.5), the plan's hours
against the second wall (target within 25%), and each run's final losses in both (the same
seeds: equal to float tolerance, `--tolerance`). `--steps` (and `--variant=quick`) shrink it
for tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

from benchmarks import arrangements as bench_arrangements
from benchmarks import run as bench
from scale_ablation.sweeping import arrangements

REPO = bench_arrangements.REPO
SLICE = '''"""dk_exponent:{variant}'s slice for benchmarks/arrangement_check.py (generated)."""
from experiments import dk_exponent
from scale_ablation.training import experiment_files

OVERRIDES = {overrides!r}


def get_config(arg=None):
    return experiment_files.apply_overrides(dk_exponent.get_config(arg), OVERRIDES)


def sweep(arg=None):
    return [p for p in dk_exponent.sweep(arg) if p["model.init"] == {init!r}
            and p["model.qk_dim"] in {qk_dims!r} and p["train.seed"] == {seed!r}]
'''
TOTAL = re.compile(r"^total: .* device-hours on cpu \(([0-9,]+) s\)", re.MULTILINE)
PICKED = re.compile(r"^\[sweep\] (arrangement: .*)$", re.MULTILINE)
COMPARED = ("final_val_loss", "final_train_loss")


def write_slice(folder: str, args: argparse.Namespace) -> str:
    """The slice's experiment file in `folder`; its spec."""
    overrides = {}
    if args.steps:
        config = bench_arrangements.shape_config("dk_exponent", args.variant == "quick")
        overrides = bench_arrangements.short_overrides(config, args.steps)
    path = os.path.join(folder, "dk_exponent_slice.py")
    with open(path, "w") as f:
        f.write(SLICE.format(variant=args.variant, overrides=overrides, init=args.init,
                             qk_dims=tuple(args.qk_dims), seed=args.seed))
    return f"{path}:{args.variant}"


def sweep(spec: str, workdir: str, *flags: str) -> tuple[float, str]:
    """(wall seconds, stdout) of one sweep command; raises if it does not exit 0."""
    argv = [sys.executable, "-m", "scale_ablation.sweep", f"--config={spec}",
            f"--workdir={workdir}", "--report=False", *flags]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:])} exited {done.returncode}:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall, done.stdout


def finals(workdir: str) -> dict[str, dict]:
    """Run name -> its summary's final losses and status."""
    out = {}
    for name in sorted(os.listdir(workdir)):
        path = os.path.join(workdir, name, "summary.json")
        if os.path.isfile(path):
            with open(path) as f:
                summary = json.load(f)
            out[name] = {key: summary.get(key) for key in (*COMPARED, "status")}
    return out


def differences(default: dict[str, dict], picked: dict[str, dict]) -> dict:
    """The largest difference of each final loss between the two sweeps, over the runs both
    finished, and the runs only one has."""
    largest = {key: 0.0 for key in COMPARED}
    for name in default.keys() & picked.keys():
        for key in COMPARED:
            a, b = default[name][key], picked[name][key]
            if isinstance(a, float) and isinstance(b, float):
                largest[key] = max(largest[key], abs(a - b))
    return {"max_abs": largest, "runs": len(default.keys() & picked.keys()),
            "only_one": sorted(default.keys() ^ picked.keys()),
            "statuses_differ": sorted(n for n in default.keys() & picked.keys()
                                      if default[n]["status"] != picked[n]["status"])}


def in_repo(text: str | None) -> str | None:
    """`text` with this checkout's absolute path written relative to it: a results file is
    read on other machines."""
    return text and text.replace(os.path.join(str(REPO), ""), "")


def check(args: argparse.Namespace) -> dict:
    """Both sweeps and the plan; the results."""
    os.makedirs(args.workdir, exist_ok=True)
    spec = write_slice(args.workdir, args)
    model, cores = arrangements.machine()
    results = {"command": " ".join(["python -m benchmarks.arrangement_check", *args.given]),
               "machine": bench.machine(), "cpu_model": model, "cores": cores,
               "uptime_before": bench_arrangements.uptime(), "slice": {
                   "variant": args.variant, "init": args.init, "qk_dims": args.qk_dims,
                   "seed": args.seed, "steps": args.steps or "the study's"},
               "table": in_repo((arrangements.read_table() or {}).get("path"))}
    default_wall, _ = sweep(spec, os.path.join(args.workdir, "default"), "--parallel=1",
                            "--max_members=0")
    results["uptime_between"] = bench_arrangements.uptime()
    picked_dir = os.path.join(args.workdir, "picked")
    _, plan = sweep(spec, picked_dir, "--plan")
    picked_wall, out = sweep(spec, picked_dir)
    planned = TOTAL.search(plan)
    picked = PICKED.search(out)
    hours = float(planned.group(1).replace(",", "")) / 3600 if planned else None
    results.update(
        runs=len(finals(os.path.join(args.workdir, "default"))),
        default_wall_s=default_wall, picked_wall_s=picked_wall,
        speedup=default_wall / picked_wall, speedup_target=1.5,
        picked=picked.group(1) if picked else "today's default (no table for this CPU)",
        plan=in_repo(plan.strip()).splitlines(), plan_hours=hours,
        plan_error=(hours * 3600 / picked_wall - 1) if hours is not None else None,
        finals=differences(finals(os.path.join(args.workdir, "default")), finals(picked_dir)),
        tolerance=args.tolerance, uptime_after=bench_arrangements.uptime())
    results["passed"] = {
        "speedup >= 1.5": results["speedup"] >= 1.5,
        "plan within 25%": hours is not None and abs(results["plan_error"]) <= 0.25,
        "same numbers": max(results["finals"]["max_abs"].values()) <= args.tolerance
        and not results["finals"]["only_one"] and not results["finals"]["statuses_differ"]}
    return results


def parse(argv: list[str]) -> argparse.Namespace:
    p = bench_arrangements._Parser(prog="python -m benchmarks.arrangement_check",
                                   description=__doc__.split("\n\n")[0])
    p.add_argument("--qk_dims", default="16,64", help="the slice's d_k")
    p.add_argument("--init", default="fan_in", choices=("fan_in", "gpt2"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="cpu", choices=("cpu", "quick"))
    p.add_argument("--steps", type=int, default=0, help="shorter runs (tests); 0: the study's")
    p.add_argument("--tolerance", type=float, default=1e-3, help="final losses' largest gap")
    p.add_argument("--workdir", default=None, help="default: runs/arrangement_check_<date>")
    p.add_argument("--load_label", choices=("auto", "idle", "loaded"), default="auto")
    p.add_argument("--out", default=None, help="default: benchmarks/results/arrangement_check_...")
    args = p.parse_args(argv)
    args.given = argv
    try:
        args.qk_dims = [int(d) for d in args.qk_dims.split(",") if d.strip()]
    except ValueError:
        p.error(f"--qk_dims wants comma-separated integers, got {args.qk_dims!r}")
    today = datetime.date.today().isoformat()
    args.workdir = args.workdir or os.path.join(REPO, "runs", f"arrangement_check_{today}")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    model, cores = arrangements.machine()
    loaded = bench_arrangements.is_loaded(args.load_label, cores)
    out = args.out or bench_arrangements.default_out(model, cores, loaded, False).replace(
        "arrangements_", "arrangement_check_")
    results = {**check(args), "loaded": loaded}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"{results['runs']} runs: default {results['default_wall_s']:.0f} s, picked "
          f"{results['picked_wall_s']:.0f} s (×{results['speedup']:.2f}; {results['picked']})")
    error = results["plan_error"]
    print(f"plan {results['plan_hours']} h against {results['picked_wall_s'] / 3600:.3f} h "
          f"measured" + (f" ({error:+.0%})" if error is not None else ""))
    print(f"final losses: largest gap {results['finals']['max_abs']}; passed "
          f"{results['passed']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
