"""Learning-rate transfer across width (μP's claim; Yang et al. 2022; Lingle 2024's table): per
(parametrisation, policy) the located best LR at each width, and whether it stays put.

Rule: each width's optimum is `optimum.fit_optimum` over its LR grid (mean over seeds; the
parabola's vertex through the best point and its neighbours). A setting *transfers* when the
largest and the smallest located optimum over the widths are within one grid step of each
other (their ratio <= the grid's ratio, ×2 here); it *moves* when they are not. A best LR on its
grid's edge is a bound, not a location: the verdict is then inconclusive, unless the interior
widths alone already move by more than a step. `Transfer.judge(rows)` turns that into a claim's
verdict (supported when every listed setting does what the claim expects).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import optimum
from scale_ablation.analysis.claims import Verdict

WIDTH = "override:model.d_model"
PARAMETRIZATION = "override:model.parametrization"


def optima(rows: list[dict]) -> dict[tuple[str, str], dict[int, optimum.Optimum]]:
    """(parametrisation, policy) -> width -> located optimum of the primary metric."""
    key, _ = cmp.primary_metric(rows)
    curves: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in rows:
        group = (str(r.get(PARAMETRIZATION, "sp")), r["policy"])
        curves[group][int(r[WIDTH])][r["seed"]][r["lr"]] = cmp.finished_value(r, key)
    out: dict = {}
    for group, by_width in curves.items():
        out[group] = {}
        for width, by_seed in sorted(by_width.items()):
            lrs = sorted({lr for seeds in by_seed.values() for lr in seeds})
            losses = {s: [v.get(lr) for lr in lrs] for s, v in by_seed.items()}
            try:
                out[group][width] = optimum.fit_optimum(lrs, losses, n_boot=200)
            except ValueError:  # fewer than two LRs, or none finished
                continue
    return out


def spread(by_width: dict[int, optimum.Optimum]) -> tuple[float, float, bool]:
    """(max/min of the located optima over widths, the grid's step, any at an edge)."""
    stars = [o.lr_star for o in by_width.values()]
    grids = [o.lrs for o in by_width.values()]
    step = max(max(b / a for a, b in itertools.pairwise(g)) for g in grids)
    return max(stars) / min(stars), step, any(not o.interior for o in by_width.values())


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Claim: the best LR of each listed (parametrisation, policy) is (expect=True) or is not
    (False) the same at every width, within one grid step."""

    settings: tuple[tuple[str, str], ...]  # (parametrisation, policy)
    expect: bool = True

    def describe(self) -> str:
        who = "; ".join(f"{p} with {policy}" for p, policy in self.settings)
        does = "stays within" if self.expect else "moves by more than"
        return (f"supported if the located best LR of {who} {does} one grid step across the "
                "widths (optimum.fit_optimum per width; an edge optimum is a bound)")

    def judge(self, rows: list[dict]):
        found = optima(rows)
        numbers, outcomes = [], []
        for setting in self.settings:
            by_width = found.get(setting)
            if not by_width or len(by_width) < 2:
                outcomes.append("missing")
                continue
            ratio, step, edge = spread(by_width)
            moves = ratio > step * (1 + 1e-9)
            outcome = "moves" if moves else ("edge" if edge else "transfers")
            outcomes.append(outcome)
            located = ", ".join(f"{w}: {o.lr_star:.3g}{'' if o.interior else ' (edge)'}"
                                for w, o in by_width.items())
            numbers.append(f"{setting[0]} {setting[1]}: best LR by width {located}; "
                           f"max/min {ratio:.2f} against a step of {step:.2f} → {outcome}")
        wanted = "transfers" if self.expect else "moves"
        if all(o == wanted for o in outcomes):
            return Verdict("supported", f"every setting {wanted}", tuple(numbers))
        if any(o in ("transfers", "moves") and o != wanted for o in outcomes):
            return Verdict("contradicted", "a setting does the opposite", tuple(numbers))
        return Verdict("inconclusive", "an optimum at a grid edge or missing runs",
                       tuple(numbers))


