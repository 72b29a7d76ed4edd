"""The "trains smoothly" rule (`claims.Unstable`), verdicts.py's rule for it: per (policy, d_k)
and learning rate, whether every run completed with no failure kind of the taxonomy (or of the
rule's `kinds`), and the verdict over the learning rates."""

from __future__ import annotations

from collections import defaultdict

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import failures
from scale_ablation.analysis.claims import Unstable, Verdict

SMOOTH, ROUGH, UNKNOWN = "smooth", "rough", "unknown"
LEARNED_MARGIN = 0.3  # bits per byte below the bigram line: the runs learned beyond counting


def barely_learns(runs: list[dict]) -> str:
    """"" when the best finished run ends LEARNED_MARGIN or more below its bigram line (or
    either is unknown), else what it says about a smooth LR: a model that trains smoothly
    without learning much says little about stability (issue 54)."""
    values = [v for r in runs if (v := cmp.finished_value(r, "final_val_bpb")) is not None]
    bigram = [r["baseline_bigram_bpb"] for r in runs if r.get("baseline_bigram_bpb") is not None]
    if not values or not bigram or min(values) <= min(bigram) - LEARNED_MARGIN:
        return ""
    return (f"barely learns: its best run ends {min(bigram) - min(values):.2f} bits per byte "
            f"below the bigram line (less than {LEARNED_MARGIN})")


def _lr_standing(runs: list[dict], kinds: tuple[str, ...] = ()) -> str:
    """ROUGH when a finished run has a failure kind (of `kinds`, when given), SMOOTH when every
    run completed with none, UNKNOWN otherwise (a run without a result counts neither way)."""
    done = cmp.finished_rows(runs)
    def rough(r: dict) -> bool:
        found = failures.row_failures(r)
        return bool(set(found) & set(kinds)) if kinds else bool(found or r["status"] != "completed")
    if any(rough(r) for r in done):
        return ROUGH
    return SMOOTH if len(done) == len(runs) else UNKNOWN


def _lr_standings(rows: list[dict], kinds: tuple[str, ...] = ()
                  ) -> dict[tuple[str, int], dict[float, str]]:
    """(policy, d_k) -> learning rate -> its standing (`_lr_standing`), in LR order."""
    by_lr: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_lr[(r["policy"], r["d_k"])][r["lr"]].append(r)
    return {group: {lr: _lr_standing(lrs[lr], kinds) for lr in sorted(lrs)}
            for group, lrs in by_lr.items()}


def _failure_counts(runs: list[dict]) -> str:
    done = cmp.finished_rows(runs)
    counts = {kind: sum(kind in failures.row_failures(r) for r in done)
              for kind in failures.FAILURE_KINDS}
    found = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items() if n)
    unfinished = len(runs) - len(done)
    return (f"{found or 'no failures'} of {len(done)} runs"
            + (f" ({unfinished} more without a result)" if unfinished else ""))


def _unstable_line(policy: str, d_k: int, lrs: dict[float, str], runs: list[dict],
                   kinds: tuple[str, ...] = ()) -> str:
    def listed(standing: str) -> str:
        return ", ".join(f"{lr:.3g}" for lr, s in lrs.items() if s == standing)
    unknown, smooth = listed(UNKNOWN), listed(SMOOTH)
    named = " or ".join(k.replace("_", " ") for k in kinds)
    # Never "...: none" for an empty list: `none` is a policy (scale 1).
    head = ((f"no run {named} at LR {smooth}; " if smooth else f"at every LR a run {named}; ")
            if kinds else
            f"smooth at LR {smooth}; " if smooth else "smooth at no LR; ")
    weak = barely_learns(runs) if smooth else ""
    return (f"{policy}, d_k={d_k}: {head}"
            + (f"unknown at LR {unknown} (runs without a result); " if unknown else "")
            + _failure_counts(runs) + (f"; {weak}" if weak else ""))


def judge_unstable(rule: Unstable, rows: list[dict], caveats: list[str]) -> Verdict:
    rows = [r for r in rows if r["policy"] in rule.policies and r["d_k"] >= rule.min_d_k]
    standings = _lr_standings(rows, rule.kinds)
    numbers = tuple(_unstable_line(policy, d_k, lrs, [r for r in rows
                                                      if (r["policy"], r["d_k"]) == (policy, d_k)],
                                   rule.kinds)
                    for (policy, d_k), lrs in standings.items())
    if not standings:
        return Verdict("inconclusive", "no runs of these policies", numbers)
    def named(test) -> str:
        return "; ".join(f"{p} d_k={d}" for (p, d), lrs in standings.items()
                         if test(set(lrs.values())))
    trains = named(lambda found: SMOOTH in found)
    weak = "; ".join(f"{p} d_k={d}" for (p, d), lrs in standings.items() if SMOOTH in
                     set(lrs.values()) and barely_learns([r for r in rows
                                                          if (r["policy"], r["d_k"]) == (p, d)]))
    weak = f" ({weak} barely learns: its line says how little)" if weak else ""
    fails = named(lambda found: found == {ROUGH})
    unknown = named(lambda found: UNKNOWN in found and SMOOTH not in found)
    if caveats:
        return Verdict("inconclusive", "this sweep cannot tell (see the caveats)", numbers)
    if rule.expect_unstable:
        if trains:
            return Verdict("contradicted", f"trains smoothly at some LR: {trains}{weak}",
                           numbers)
        if unknown:
            return Verdict("inconclusive", "some learning rates have runs without a result: "
                           f"{unknown}", numbers)
        return Verdict("supported", "no learning rate trains smoothly", numbers)
    if fails:
        return Verdict("contradicted", f"no learning rate trains smoothly: {fails}", numbers)
    if unknown:
        return Verdict("inconclusive", "no learning rate known to train smoothly, some with "
                       f"runs without a result: {unknown}", numbers)
    return Verdict("supported", f"every policy trains smoothly at some learning rate{weak}",
                   numbers)
