r"""XLA CPU flag sets side by side at a study's shape, in the arrangement the sweep's workers use
(P pinned processes of one core each), with PyTorch's loop beside them (issue 56 item 3):

    python -m benchmarks.xla_flag_sets [--shapes=dk_exponent] [--members=1,16] [--rounds=2]
        [--window=5] [--out=FILE.json]

Each flag set (`FLAG_SETS`) is measured as `benchmarks.arrangements` measures a family: one
worker per core, pinned, compiling the sweep's own train-step program (solo for K = 1, the
ensemble, its members in turn, for K > 1) with the flags in XLA_FLAGS, timed windows started
together. The order of the flag sets is reversed every other round and a figure is the median
of its rounds, so a drift of the machine's speed lands on every set alike.

Why these sets: the whole step at dk_exponent's shape runs far slower than its parts jitted
alone (the parts summed to 0.54-0.66 of it), and its optimised HLO shows where the rest can go:
86 copies of every parameter and Adam moment at the step's entry (copy insertion keeping the
donated inputs alive past the non-finite guard's select; region analysis proves them needless,
and the runs' compiler options now ask for it),
and 120 YNNPACK fusions, 85 of them reductions of a few hundred floats (gradient norms,
LayerNorm statistics) that pay YNN's per-call set-up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys

from benchmarks import arrangements as table
from benchmarks import run as bench
from scale_ablation.sweeping import arrangements

YNN = "--xla_cpu_experimental_ynn_fusion_type"
# Every set compiles with the runs' compiler options, which include copy insertion by region
# analysis since this benchmark found it (2026-12-07: solo ×1.15, same bits); that day's file
# measured it as two sets of its own, which the default now is.
FLAG_SETS = {
    "default": "",
    "no_ynn": arrangements.NO_YNN,
    "ynn_without_reduce": f"{YNN}=-reduce",
    "ynn_dots_only": f"{YNN}=dot",
}


def one_round(args, order: list[str]) -> list[dict]:
    """Every flag set (and PyTorch) at every shape, once: a row per measurement."""
    rows = []
    for shape in args.shapes:
        sides = [("jax", name) for name in order] + [("torch", "pytorch")] * args.torch
        for side, name in sides:
            todo = [{"kind": "step", "members": k, "program": "solo" if k == 1 else "map"}
                    for k in args.members] if side == "jax" else \
                [{"kind": "step", "members": 1, "program": "torch"}]
            spec = {"side": side, "shape": shape, "quick": False, "window": args.window,
                    "threads": 1, "measurements": todo, "xla_flags": FLAG_SETS.get(name, "")}
            rows += _rows(shape, name, todo, table.measure(spec, args.processes, 1))
            print(f"  {shape} {name} ({table.uptime()})", flush=True)
    return rows


def _rows(shape: str, name: str, todo: list[dict], results: list[list[dict]]) -> list[dict]:
    return [{"shape": shape, "flag_set": name, "members": wanted["members"],
             "program": wanted["program"],
             "run_steps_per_s": sum(r["calls"] * wanted["members"] / r["seconds"] for r in got),
             "compile_s": statistics.median(r["number"] for r in got)}
            for wanted, got in zip(todo, results, strict=True)]


def medians(rounds: list[list[dict]]) -> list[dict]:
    """Each measurement's median over the rounds (its rounds' rates kept beside it)."""
    return table.median_rows(rounds, ("shape", "flag_set", "members"),
                             ("run_steps_per_s", "compile_s"))


def show(rows: list[dict]) -> None:
    """Per shape and K: each flag set's rate and its ratio to the default's."""
    default = {(r["shape"], r["members"]): r["run_steps_per_s"] for r in rows
               if r["flag_set"] == "default"}
    for row in rows:
        ratio = "" if row["flag_set"] == "pytorch" else \
            f"  ×{row['run_steps_per_s'] / default[row['shape'], row['members']]:.3f}"
        print(f"{row['shape']:>12} K={row['members']:<3} {row['flag_set']:<20} "
              f"{row['run_steps_per_s']:7.2f} run-steps/s{ratio}  {row['rounds']}")


def parse(argv: list[str]) -> argparse.Namespace:
    p = table._Parser(prog="python -m benchmarks.xla_flag_sets",
                      description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="dk_exponent", help=f"from {list(table.SHAPES)}")
    p.add_argument("--members", default="1,16", help="K: runs a program")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="pinned processes of one core each")
    p.add_argument("--window", type=float, default=5.0, help="seconds timed per measurement")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no_torch", dest="torch", action="store_false", help="JAX only")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.given = argv
    args.shapes = [s for s in args.shapes.split(",") if s]
    if bad := [s for s in args.shapes if s not in table.SHAPES]:
        p.error(f"--shapes: unknown {bad}; choose from {list(table.SHAPES)}")
    try:
        args.members = sorted({int(k) for k in args.members.split(",") if k})
    except ValueError:
        p.error("--members wants comma-separated integers")
    if not args.members or min(args.members) < 1:
        p.error(f"--members wants positive K, got {args.members}")
    if not 1 <= args.processes <= (os.cpu_count() or 1):
        p.error(f"--processes must be 1..{os.cpu_count()}, got {args.processes}")
    if args.rounds < 1 or args.window <= 0:
        p.error("--rounds must be >= 1 and --window > 0")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    model, cores = arrangements.machine()
    uptime_before = table.uptime()
    loaded = "_LOADED" * table.is_loaded("auto", cores)  # before the workers load the machine
    names = list(FLAG_SETS)
    rounds = [one_round(args, names if i % 2 == 0 else names[::-1]) for i in range(args.rounds)]
    rows = medians(rounds)
    show(rows)
    date = datetime.date.today().isoformat()
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    out = args.out or os.path.join(table.RESULTS,
                                   f"xla_flag_sets_{slug}_{cores}core_{date}{loaded}.json")
    with open(out, "w") as f:
        json.dump({"command": " ".join(["python -m benchmarks.xla_flag_sets", *args.given]),
                   "date": date, "machine": bench.machine(), "cpu_model": model,
                   "processes": args.processes, "uptime_before": uptime_before,
                   "uptime_after": table.uptime(), "window_s": args.window, "flag_sets": FLAG_SETS,
                   "entries": rows}, f, indent=2)
    print(f"wrote {os.path.relpath(out, table.REPO)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main(sys.argv[1:]))
