"""`sweep --refine`: learning rates added to a sweep's grid around each setting's best point
until it is interior and bracketed at ×√2 (`analysis.optimum.refine_points`), and their record.

Each round adds, per setting and d_k whose runs have all finished (`optimum.curve_optima`),
the LRs `refine_points` proposes, one run per seed of the curve, each a copy of the seed's run
at the best LR with `train.lr` replaced (rounded to 6 significant digits, so that run names
stay readable). refined.json in the sweep directory records every round's points before they
run, so that any later invocation of the sweep (with or without `--refine`) has them in its
grid, a killed round resumes, and a finished point is never run again.

Seeds added to a refined sweep (a larger seed list in the experiment file) run only at the
grid's own LRs, so each curve would locate its optimum on the seeds every LR has, the old ones.
`fill_seeds` completes every curve's seed × LR grid first: a seed that ran at some of a curve's
LRs gets the rest, each a copy of that seed's own run with `train.lr` replaced. Fills are
recorded as a round like any other and run whatever `--refine_rounds` says, since they add no
LR, only the seeds the experiment asks for.
"""

from __future__ import annotations

import dataclasses
import os

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import optimum
from scale_ablation.errors import ConfigError
from scale_ablation.records import jsonfiles
from scale_ablation.sweeping.sweep_grid import Point
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training.run_config import validate

REFINED_FILE = "refined.json"
LR_KEY = "train.lr"
DIGITS = 6


@dataclasses.dataclass(frozen=True)
class Proposal:
    """One setting's curve this round and what refining adds to it."""

    curve: optimum.CurveOptimum
    lrs: tuple[float, ...]  # the LRs to add ([]: none)
    added: tuple[dict, ...]  # {"name", "overrides", "parent"} per new run

    def line(self) -> str:
        """What the round found and did for this setting, as one line."""
        c, found = self.curve, self.curve.found
        where = f"{c.setting} d_k={c.d_k}"
        if c.waiting:
            return f"{where}: waiting on runs at LR {', '.join(f'{x:.3g}' for x in c.waiting)}"
        if found is None:
            return f"{where}: not located ({c.reason}); nothing to add"
        state = (f"best {found.best_lr:.3g} at the {found.edge} edge" if found.edge else
                 f"best {found.best_lr:.3g}, bracketed at ×{found.bracketed_at:.3g}")
        grid = f"of {len(found.lrs)} LRs {found.lrs[0]:.3g}–{found.lrs[-1]:.3g}"
        if not self.lrs:
            return f"{where}: {state} {grid}: interior and bracketed, nothing to add"
        seeds = len(self.added) // len(self.lrs) if self.added else 0
        return (f"{where}: {state} {grid}: adds LR {', '.join(f'{x:.6g}' for x in self.lrs)} "
                f"({seeds} seed{'s' * (seeds != 1)} each)")


def unrefinable(rows: list[dict]) -> list[str]:
    """One line per setting and d_k with a single learning rate: no curve to locate a best LR
    on, so refining has no direction to go (`optimum.curve_optima` leaves it out)."""
    return [f"{name} d_k={d_k}: one learning rate ({next(iter(by_lr)):.3g}): cannot refine it "
            "(refining needs two or more LRs per setting)"
            for (name, d_k), by_lr in cmp.curves(rows).items() if len(by_lr) < 2]


def _rounded(lr: float) -> float:
    return float(f"{lr:.{DIGITS}g}")


def propose(curves: list[optimum.CurveOptimum], points: dict[str, Point]) -> list[Proposal]:
    """This round's proposal per curve: the new runs' names and overrides, derived from the
    curve's runs at its best LR (`points`: run name -> the sweep's point)."""
    out = []
    for curve in curves:
        lrs = tuple(_rounded(lr) for lr in optimum.refinements(curve))
        added = []
        for lr in lrs:
            for run in curve.runs[curve.found.best_lr]:
                parent = points[run["name"]]
                overrides = {**parent.overrides, LR_KEY: lr}  # train.lr keeps its place
                name = experiment.run_name(overrides)
                if name not in points:
                    added.append({"name": name, "overrides": overrides, "parent": parent.name})
        out.append(Proposal(curve, lrs, tuple(added)))
    return out


def fill_seeds(rows: list[dict], points: dict[str, Point]) -> list[dict]:
    """The runs that complete each curve's seed × LR grid ({"name", "overrides", "parent"} per
    run, as `propose` makes them): for each seed run at some of a curve's LRs, a copy of one of
    its runs at each LR it lacks, with the LR as the grid's own run there names it."""
    added = []
    for by_lr in cmp.curves(rows).values():
        seeds_at = {lr: {r["seed"] for r in runs} for lr, runs in by_lr.items()}
        own_run = {r["seed"]: r for runs in by_lr.values() for r in runs}  # seed -> one run
        for lr, runs in by_lr.items():
            grid_point = points.get(runs[0]["name"])
            grid_lr = lr if grid_point is None else grid_point.overrides.get(LR_KEY, lr)
            for seed in sorted(set(own_run) - seeds_at[lr]):
                parent = points.get(own_run[seed]["name"])
                if parent is None:  # a run directory the grid no longer has
                    continue
                overrides = {**parent.overrides, LR_KEY: grid_lr}
                name = experiment.run_name(overrides)
                if name not in points:
                    added.append({"name": name, "overrides": overrides, "parent": parent.name})
    return added


def fill_line(added: list[dict], rows: list[dict]) -> str:
    """What a fill adds, as one line."""
    seed_of = {r["name"]: r["seed"] for r in rows}
    seeds = sorted({seed_of[entry["parent"]] for entry in added})
    return (f"{len(added)} runs complete the seed × LR grid of their curves "
            f"(seed{'s' * (len(seeds) != 1)} {', '.join(map(str, seeds))})")


def final_line(proposals: list[Proposal], added: list[dict], done: int, single: int,
               rounds: int) -> str:
    """What the last round found, as one line: why refining stops (`rounds`: the limit)."""
    waiting = sum(bool(p.curve.waiting) for p in proposals)
    if single and not added and not waiting:  # "every setting is interior" would be false
        where = (f"the {len(proposals)} with an LR grid are interior and bracketed at ×√2 "
                 f"after {done} rounds" if proposals else "no setting has an LR grid")
        return f"{single} setting(s) with one learning rate cannot be refined; {where}"
    if added:
        return (f"not added: --refine_rounds={rounds} rounds are recorded; "
                f"{sum(bool(p.lrs) for p in proposals)} settings are not yet interior and "
                "bracketed at ×√2 (rerun with a larger --refine_rounds)")
    if waiting:
        return f"{waiting} settings wait on runs that did not finish (rerun to continue)"
    return f"every setting is interior and bracketed at ×√2 after {done} rounds"


def read_rounds(sweep_dir: str) -> list[list[dict]]:
    """The rounds refined.json records ([] if none), each a list of added runs."""
    record = jsonfiles.read_json(os.path.join(sweep_dir, REFINED_FILE)) or {}
    return list(record.get("rounds", []))


def record_round(sweep_dir: str, added: list[dict]) -> None:
    """Append a round to refined.json, before its runs start (a killed round resumes)."""
    rounds = [*read_rounds(sweep_dir), added]
    jsonfiles.write_json_atomic(os.path.join(sweep_dir, REFINED_FILE), {"rounds": rounds},
                                sort_keys=False)


def points_of(added: list[dict], points: list[Point]) -> list[Point]:
    """The Points of recorded runs, each its parent's config with its own LR; ValueError naming
    a run whose parent the grid no longer has, or whose config is refused."""
    by_name = {p.name: p for p in points}
    out = []
    for entry in added:
        name = entry["name"]
        if name in by_name:  # already in the grid (the experiment file has it now)
            continue
        parent = by_name.get(entry["parent"])
        if parent is None:
            raise ValueError(f"{REFINED_FILE}: run {name} refines {entry['parent']}, which "
                             f"the grid no longer has; move {REFINED_FILE} aside to drop it")
        config = experiment.apply_overrides(parent.config, {LR_KEY: entry["overrides"][LR_KEY]})
        try:
            validate(config)
        except ConfigError as error:
            raise ValueError(f"{REFINED_FILE}: run {name}: {error}") from None
        # A point made without `expand`: the run's own start validates and reads its files.
        point = Point(name, dict(entry["overrides"]), config)
        by_name[name] = point
        out.append(point)
    return out


def recorded_points(sweep_dir: str, points: list[Point]) -> list[Point]:
    """The points of every recorded round that the grid `points` does not have, in order."""
    out: list[Point] = []
    for added in read_rounds(sweep_dir):
        out += points_of(added, [*points, *out])
    return out
