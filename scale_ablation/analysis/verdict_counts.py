"""The family's tests, and the claim rules that count runs: `Counts` (solved fractions, MQAR)
and `Diverges` (diverged runs per learning rate), both by Fisher's exact test, and `Trend` (a
failure's share across d_k) by the exact trend test. Their tests join
the study's one Holm family in `verdicts.judge_family`, which states the rules.
"""

from __future__ import annotations

import math
from collections import defaultdict

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import failures, intervals, significance
from scale_ablation.analysis.claims import (
    OPPOSITE,
    OPPOSITE_COUNT,
    Counts,
    Diverges,
    Trend,
    Verdict,
)

ALPHA = significance.ALPHA


class Test:
    """One hypothesis test of the family: its raw p-value, and the adjusted one once known."""

    def __init__(self, p: float) -> None:
        self.p, self.adjusted = p, math.nan


def p_text(test: Test) -> str:
    return "p n/a" if math.isnan(test.p) else f"p = {test.p:.3g}, Holm {test.adjusted:.3g}"


def split_of(metric: str) -> str:
    """What a number is measured on: a split for final_val*/final_test* keys, else the runs'
    training diagnostics (max |logit|, entropy, learned scale)."""
    if metric.startswith("final_test"):
        return "the test split"
    return "the validation split" if metric.startswith("final_val") else "training diagnostics"


def unit_of(metric: str, log10: bool = False) -> str:
    """The unit of a difference in `metric` (empty when it has none: a logit, a ratio)."""
    if log10:
        return "in log10"
    if metric.endswith("bpb") or metric == "lr_sensitivity":
        return "bits per byte"
    return "in accuracy" if "accuracy" in metric else ""


class FisherCounts:
    """A rule of counts, each entry's last two fields (k, n) and the reference's (k_ref, n_ref),
    tested by Fisher's exact test in `self.fisher`; a decision names the higher fraction."""

    HIGHER, LOWER = "better", "worse"
    entries: list[tuple]
    fisher: list[Test]

    def tests(self) -> list[Test]:
        return self.fisher

    def decision(self, i: int) -> str:
        *_, (k, n), (k_ref, n_ref) = self.entries[i]
        if self.fisher[i].adjusted >= ALPHA:
            return intervals.UNRESOLVED
        return self.HIGHER if k / n > k_ref / n_ref else self.LOWER


class Counting(FisherCounts):
    """A Counts rule: solved fractions per setting at its best LR, Fisher against the reference."""

    def __init__(self, rule: Counts, rows: list[dict]) -> None:
        rows = [r for r in rows if r["d_k"] >= rule.min_d_k]
        self.rule = rule
        # The best LR is chosen on the validation metric; the runs there are counted on the
        # disjoint test split when every finished run has it.
        self.counted = cmp.report_metric(rows, rule.metric)
        solved = solved_counts(rule, rows, self.counted)
        refs = {d_k: s for (policy, d_k), s in solved.items() if policy == rule.reference}
        self.entries = [(policy, d_k, s, refs[d_k]) for (policy, d_k), s in solved.items()
                        if policy != rule.reference and d_k in refs
                        and (not rule.policies or policy in rule.policies)]
        self.fisher = [Test(significance.fisher_exact_p(s[0], s[1], r[0], r[1]))
                       for _, _, s, r in self.entries]

    def verdict(self, caveats: list[str]) -> Verdict:
        numbers = tuple(self._line(i) for i in range(len(self.entries)))
        if not self.entries:
            return Verdict("inconclusive", "no runs to count", numbers)
        decisions = [self.decision(i) for i in range(len(self.entries))]
        if any(d in OPPOSITE[self.rule.expect] for d in decisions):
            return Verdict("contradicted", "decided against the claim", numbers)
        if caveats or any(d != self.rule.expect for d in decisions):
            return Verdict("inconclusive", "not resolved by the counts", numbers)
        return Verdict("supported", f"all {len(decisions)} counts are {self.rule.expect}", numbers)

    def _line(self, i: int) -> str:
        policy, d_k, (k, n), (k_ref, n_ref) = self.entries[i]
        low, high = significance.wilson(k, n)
        ref_low, ref_high = significance.wilson(k_ref, n_ref)
        split = split_of(self.counted)
        return (f"{policy}, d_k={d_k}: {k} of {n} solved on {split} (95% Wilson "
                f"{low:.2f}–{high:.2f}) "
                f"against {self.rule.reference} {k_ref} of {n_ref} ({ref_low:.2f}–"
                f"{ref_high:.2f}); Fisher {p_text(self.fisher[i])} → {self.decision(i)}")


def solved_counts(rule: Counts, rows: list[dict],
            counted: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(policy, d_k) -> (successes in `counted`, runs) over the runs at the setting's best LR
    by mean `rule.metric` (every run of the setting when it has one LR); a run without a value
    failed."""
    out = {}
    for (_, d_k), by_lr in cmp.curves(rows).items():
        def mean(runs: list[dict]) -> float:
            values = [cmp.finished_value(r, rule.metric) for r in runs]
            return sum(v or 0.0 for v in values) / len(values)
        runs = max(by_lr.values(), key=mean)
        hits = sum((cmp.finished_value(r, counted) or -math.inf) >= rule.success_at
                   for r in runs)
        out[(runs[0]["policy"], d_k)] = (hits, len(runs))
    return out


class Divergences(FisherCounts):
    """A Diverges rule: (diverged, finished) runs per policy, d_k and LR, Fisher against the
    reference's runs at the same d_k and LR."""

    HIGHER, LOWER = "more", "fewer"

    def __init__(self, rule: Diverges, rows: list[dict]) -> None:
        counts: dict = defaultdict(lambda: [0, 0])  # (policy, d_k, lr) -> [diverged, runs]
        for r in rows:
            if r["status"] in ("completed", "diverged"):
                count = counts[(r["policy"], r["d_k"], r["lr"])]
                count[0] += r["status"] == "diverged"
                count[1] += 1
        self.rule = rule
        self.reference_diverged = sum(c[0] for (p, _, _), c in counts.items()
                                      if p == rule.reference)
        self.entries = [(p, d_k, lr, tuple(c), tuple(counts[(rule.reference, d_k, lr)]))
                        for (p, d_k, lr), c in sorted(counts.items())
                        if p in rule.policies and (rule.reference, d_k, lr) in counts]
        self.fisher = [Test(significance.fisher_exact_p(*count, *ref))
                       for *_, count, ref in self.entries]

    def verdict(self, caveats: list[str]) -> Verdict:
        numbers = tuple(self._line(i) for i in range(len(self.entries)))
        expect = self.rule.expect
        if not self.entries:
            return Verdict("inconclusive", "no runs to count", numbers)
        decisions = [self.decision(i) for i in range(len(self.entries))]
        if any(d == OPPOSITE_COUNT[expect] for d in decisions):
            return Verdict("contradicted", "decided against the claim at some LR", numbers)
        if expect == "more" and not any(count[0] for *_, count, _ in self.entries):
            # "None diverged" from a sweep that cannot support a verdict (one seed, nothing
            # learned) is a smoke run's count, not a finding against the claim.
            return Verdict("inconclusive" if caveats else "contradicted",
                           f"no run of {', '.join(self.rule.policies)} diverged"
                           + (" (this sweep cannot support a verdict: see the caveats)"
                              if caveats else ""), numbers)
        if expect == "fewer" and not self.reference_diverged:
            return Verdict("inconclusive", f"no run of {self.rule.reference} diverged: "
                           "nothing to cure", numbers)
        if caveats or expect not in decisions:
            return Verdict("inconclusive", "not resolved by the counts", numbers)
        lrs = ", ".join(f"{e[2]:.3g}" for e, d in zip(self.entries, decisions, strict=True)
                        if d == expect)
        return Verdict("supported", f"{expect} divergences at LR {lrs}", numbers)

    def _line(self, i: int) -> str:
        policy, d_k, lr, (k, n), (k_ref, n_ref) = self.entries[i]
        return (f"{policy}, d_k={d_k}, lr={lr:.3g}: {k} of {n} diverged against "
                f"{self.rule.reference} {k_ref} of {n_ref}; Fisher {p_text(self.fisher[i])} "
                f"→ {self.decision(i)}")


class Trending:
    """A Trend rule: (runs with a failure of its kinds, finished runs) per d_k of its policies,
    one two-sided exact trend test; the decision is the direction of the smaller tail."""

    def __init__(self, rule: Trend, rows: list[dict]) -> None:
        counts: dict = defaultdict(lambda: [0, 0])  # d_k -> [with the failure, finished]
        for r in rows:
            if r["policy"] in rule.policies and r["status"] in ("completed", "diverged"):
                counts[r["d_k"]][0] += bool(set(failures.row_failures(r)) & set(rule.kinds))
                counts[r["d_k"]][1] += 1
        self.rule = rule
        self.groups = [(d_k, *counts[d_k]) for d_k in sorted(counts)]
        upper, lower = (significance.exact_trend_p([(k, n) for _, k, n in self.groups])
                        if len(self.groups) >= 2 else (math.nan, math.nan))
        self.direction = "grows" if upper <= lower else "falls"
        self.test = Test(min(1.0, 2 * min(upper, lower)))

    def tests(self) -> list[Test]:
        return [] if math.isnan(self.test.p) else [self.test]

    def verdict(self, caveats: list[str]) -> Verdict:
        named = " or ".join(k.replace("_", " ") for k in self.rule.kinds)
        shares = "; ".join(f"d_k={d_k}: {k} of {n}" for d_k, k, n in self.groups)
        decided = self.direction if self.test.adjusted < ALPHA else intervals.UNRESOLVED
        numbers = (f"{', '.join(self.rule.policies)}, runs that {named}: {shares}; exact trend "
                   f"test {p_text(self.test)} → {decided}",)
        if len(self.groups) < 2:
            return Verdict("inconclusive", "fewer than two d_k to compare", numbers)
        if not any(k for _, k, _ in self.groups):
            return Verdict("inconclusive", f"no run {named} at any d_k: no share to follow",
                           numbers)
        if decided not in ("grows", "falls") or caveats:
            return Verdict("inconclusive", "not resolved by the counts", numbers)
        if decided != self.rule.expect:
            return Verdict("contradicted", f"the share {decided} with d_k", numbers)
        return Verdict("supported", f"the share {decided} with d_k", numbers)
