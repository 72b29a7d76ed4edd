"""Learning-rate transfer across width (μP's claim; Yang et al. 2022; Lingle 2024's table): per
(parametrisation, policy) the located best LR at each width, and whether it stays put.

Rule: each width's optimum is `optimum.fit_optimum` over its LR grid (mean over seeds; the
parabola's vertex through the best point and its neighbours), with its interval (analysis/located.py:
the best LR re-chosen in every posterior draw; coverage measured there). The margin is one grid step (×2 here). A setting *transfers* when even the intervals stay
within it: the largest upper end over the widths is at most one step above the smallest lower
end (an equivalence test, as TOST is for a difference). It *moves* when the located optima are
more than a step apart and the intervals of the two extreme widths do not overlap. Anything
between is unresolved (more seeds would decide it), and so is a setting without intervals (one
seed). A best LR on its grid's edge is a bound, not a location: the verdict is then
inconclusive, unless the others already decide a move. `Transfer.judge(rows)` turns that into a claim's verdict (supported when every
listed setting does what the claim expects).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import optimum
from scale_ablation.analysis.claims import Verdict

WIDTH = "override:model.d_model"
# The axes a transfer is judged along: the run-row column of each, and its name in the text.
AXES = {WIDTH: "width", "override:model.head_dim": "head dim",
        "override:model.qk_dim": "q/k width", "override:model.num_layers": "depth"}
PARAMETRIZATION = "override:model.parametrization"


def optima(rows: list[dict], axis: str = WIDTH
           ) -> dict[tuple[str, str], dict[int, optimum.Optimum]]:
    """(parametrisation, policy) -> value of `axis` (a run-row column) -> located optimum of the
    primary metric. A seed not run at every LR of a value is left out there (a seed added at
    some values only is missing at the others, not failed); a run without a finite loss counts
    as failed (`optimum.fit_optimum`)."""
    key, _ = cmp.primary_metric(rows)
    curves: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in rows:
        if r.get(axis) in (None, ""):
            continue
        group = (str(r.get(PARAMETRIZATION, "sp")), r["policy"])
        curves[group][int(r[axis])][r["seed"]][r["lr"]] = cmp.finished_value(r, key)
    out: dict = {}
    for group, by_width in curves.items():
        out[group] = {}
        for width, by_seed in sorted(by_width.items()):
            lrs = sorted({lr for seeds in by_seed.values() for lr in seeds})
            losses = {s: [v[lr] for lr in lrs] for s, v in by_seed.items() if set(lrs) <= set(v)}
            try:
                # optimum.N_BOOT draws and seed 0, as the best-LR table's: one interval per width.
                out[group][width] = optimum.fit_optimum(lrs, losses)
            except ValueError:  # fewer than two LRs, or none finished
                continue
    return out


def spread(by_width: dict[int, optimum.Optimum]) -> tuple[float, float, bool]:
    """(max/min of the located optima over widths, the grid's step, any at an edge)."""
    stars = [o.lr_star for o in by_width.values()]
    grids = [o.lrs for o in by_width.values()]
    step = max(max(b / a for a, b in itertools.pairwise(g)) for g in grids)
    return max(stars) / min(stars), step, any(not o.interior for o in by_width.values())


def outcome(by_width: dict[int, optimum.Optimum]) -> tuple[str, float, float]:
    """('transfers' | 'moves' | 'unresolved' | 'edge', max/min of the optima, the step)."""
    ratio, step, edge = spread(by_width)
    tolerance = 1 + 1e-9
    lowest = min(by_width.values(), key=lambda o: o.lr_star).lr_ci
    highest = max(by_width.values(), key=lambda o: o.lr_star).lr_ci
    # An edge optimum's true place lies beyond its edge, which can only widen a spread that is
    # already more than a step with intervals apart: a move is decided even then.
    if ratio > step * tolerance and lowest and highest and highest[0] > lowest[1]:
        return "moves", ratio, step
    if edge:
        return "edge", ratio, step
    cis = [o.lr_ci for o in by_width.values()]
    if any(ci is None or ci[0] == 0 for ci in cis):  # one seed, or an end past the grid
        return "unresolved", ratio, step
    if max(hi for _, hi in cis) / min(lo for lo, _ in cis) <= step * tolerance:
        return "transfers", ratio, step
    return "unresolved", ratio, step


def _ci_text(found: optimum.Optimum) -> str:
    """' [low, high]', an end past the grid written as a bound past its edge; '' without one."""
    if (ci := found.lr_ci) is None:
        return ""
    low = f"< {found.lrs[0]:.3g}" if ci[0] == 0 else f"{ci[0]:.3g}"
    high = f"> {found.lrs[-1]:.3g}" if ci[1] == math.inf else f"{ci[1]:.3g}"
    return f" [{low}, {high}]"


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Claim: the best LR of each listed (parametrisation, policy) is (expect=True) or is not
    (False) the same at every width, within one grid step."""

    settings: tuple[tuple[str, str], ...]  # (parametrisation, policy)
    expect: bool = True
    axis: str = WIDTH  # the run-row column the LR is to transfer along (`AXES`)

    def describe(self) -> str:
        who = "; ".join(f"{p} with {policy}" for p, policy in self.settings)
        along = AXES.get(self.axis, self.axis)
        does = (f"stays within one grid step across the {along} values, intervals included"
                if self.expect else f"moves by more than one grid step across the {along} "
                "values, the extreme values' intervals apart")
        return (f"supported if the located best LR of {who} {does} (optimum.fit_optimum per "
                "width, its interval located.py's with the best LR re-chosen in every draw; an "
                "edge optimum is a bound)")

    def judge(self, rows: list[dict]):
        found = optima(rows, self.axis)
        numbers, outcomes = [], []
        for setting in self.settings:
            by_width = found.get(setting)
            if not by_width or len(by_width) < 2:
                outcomes.append("missing")
                continue
            result, ratio, step = outcome(by_width)
            outcomes.append(result)
            located = ", ".join(f"{w}: {o.lr_star:.3g}{_ci_text(o)}"
                                + ("" if o.interior else " (edge)")
                                for w, o in by_width.items())
            numbers.append(f"{setting[0]} {setting[1]}: best LR by "
                           f"{AXES.get(self.axis, self.axis)} {located}; "
                           f"max/min {ratio:.2f} against a step of {step:.2f} → {result}")
        wanted = "transfers" if self.expect else "moves"
        if all(o == wanted for o in outcomes):
            return Verdict("supported", f"every setting {wanted}", tuple(numbers))
        if any(o in ("transfers", "moves") and o != wanted for o in outcomes):
            return Verdict("contradicted", "a setting does the opposite", tuple(numbers))
        return Verdict("inconclusive", "an optimum at a grid edge, intervals too wide to decide "
                       "(unresolved) or missing runs", tuple(numbers))


