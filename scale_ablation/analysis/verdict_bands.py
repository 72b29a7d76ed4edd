"""The Band rule's verdict: where a value ends relative to a policy's scale at each d_k."""

from __future__ import annotations

import math
from collections import defaultdict

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis.claims import ACROSS_BAND, Band, Verdict
from scale_ablation.model import policies


def _band_groups(rule: Band, rows: list[dict]) -> dict[tuple[str, int], tuple[list, bool]]:
    """(setting or variant, d_k) -> (the runs judged, whether their LR is on the grid's edge):
    with an LR grid, the runs at the best LR."""
    rows = [r for r in rows if r["d_k"] >= rule.min_d_k
            and (not rule.policies or r["policy"] in rule.policies)]
    if cmp.has_lr_grid(rows):
        key, higher = cmp.primary_metric(rows)
        return {(f"{b.setting} @ lr={b.lr:.3g}", b.d_k): (list(b.runs), b.at_edge)
                for b in cmp.best_lrs(rows, key, higher) if b.lr is not None}
    groups: dict = defaultdict(list)
    for r in rows:
        groups[(cmp.variant(r), r["d_k"])].append(r)
    return {name: (runs, False) for name, runs in groups.items()}


def judge_band(rule: Band, rows: list[dict]) -> Verdict:
    log_factor = math.log10(rule.factor)
    numbers, places = [], {}
    for (name, d_k), (runs, at_edge) in _band_groups(rule, rows).items():
        reference = policies.get(rule.target).base_scale(d_k)
        logs = [math.log10(v / reference) for r in runs
                if (v := cmp.finished_value(r, rule.metric)) is not None and v > 0]
        if not logs:
            continue
        found = cmp.intervals.mean_ci(logs)
        if found.half_width is None:
            place = cmp.intervals.TOO_FEW
        elif at_edge:
            place = cmp.AT_EDGE
        elif -log_factor <= found.low and found.high <= log_factor:
            place = "inside"
        elif found.high < -log_factor or found.low > log_factor:
            place = "outside"
        else:
            place = ACROSS_BAND
        places[(name, d_k)] = place
        ci = ("" if found.half_width is None else
              f", 95% CI {10 ** found.low:.3g}–{10 ** found.high:.3g}")
        numbers.append(f"{name}, d_k={d_k}: {rule.metric} / {rule.target} = "
                       f"{10 ** found.mean:.3g}{ci} (n={found.n}) → {place}")
    band = f"[{1 / rule.factor:.3g}, {rule.factor:g}]"
    if not places:
        return Verdict("inconclusive", f"no finished runs with {rule.metric}", tuple(numbers))
    named = lambda which: "; ".join(f"{n} d_k={d}" for (n, d), p in places.items()  # noqa: E731
                                    if p in which)
    if any(p == "outside" for p in places.values()):
        return Verdict("contradicted", f"outside {band}: {named(('outside',))}", tuple(numbers))
    if any(p != "inside" for p in places.values()):
        return Verdict("inconclusive", f"not resolved by the data: "
                       f"{named((ACROSS_BAND, cmp.intervals.TOO_FEW, cmp.AT_EDGE))}", tuple(numbers))
    return Verdict("supported", f"all {len(places)} inside {band}", tuple(numbers))
