"""Verdicts of a study's claims (`claims.py` declares them), computed from its run rows.

The rules, stated once:

- **Finished runs only.** A verdict rests on the runs that finished (completed or diverged:
  `run_files.FINISHED`). A run that failed, was interrupted or preempted, or never started counts
  neither for nor against a claim: every rule judges the finished runs alone, and a verdict
  whose arms (the claim's policies and its reference) have unfinished runs says how many of
  them finished. A claim whose arms have fewer finished runs than its rule needs (two paired
  seeds for a test; for "trains smoothly", every run at a learning rate) is inconclusive, and
  none finished is a caveat of the whole sweep (`limits`).
- **One family per study.** Every hypothesis test that the claims of one experiment file make
  (each paired difference, each equivalence test, each count comparison) is one family, and
  Holm's step-down correction at ALPHA is applied over all of them (`significance.holm`). Both
  p-values are printed; decisions use the adjusted one.
- **Differences** ("better"/"worse"): a two-sided paired t-test on the per-seed differences
  policy − reference. Decided when the adjusted p < ALPHA, in the direction of the mean.
- **Equivalence** (a claim of "no difference", `Compare("indistinguishable")`): two one-sided
  t-tests (TOST) against ±margin, the claim's `margin` or else the study's noise floor (the
  median seed-to-seed standard deviation of the reference's final metric). "equivalent" when the
  adjusted TOST p < ALPHA; a difference decided by the difference test contradicts the claim;
  anything else (a CI too wide to tell) is inconclusive. "Indistinguishable" alone never
  supports a claim of no difference.
- **Diverged runs in a comparison at each LR**: a diverged run has no final value, so a pair
  with one is left out; the counts are printed, and a claim with pairs lost that way is at most
  inconclusive (the pairs left cannot speak for the LRs where runs diverged; a `Diverges` claim
  counts them).
- **Counts** (`Counts`): a run is a success when its metric reaches the claim's threshold;
  solved fractions with Wilson intervals, and Fisher's exact test against the reference.
- **Divergence counts** (`Diverges`): at each learning rate, the runs that diverged against the
  reference's at that LR, by Fisher's exact test; the claim is decided by the LRs whose adjusted
  p < ALPHA.
- **A trend across d_k** (`Trend`): the share of runs with a failure kind per d_k, by the exact
  conditional trend test (two-sided; the direction of its smaller tail decides).
- **Choose on validation, report on test**: best learning rates are chosen on the validation
  metric, and comparisons use the test split's metric when every finished run has one
  (`comparisons.report_metric`); the numbers say which split they come from.
- **Trains smoothly** (`Unstable`): a learning rate at which every run completed with none of
  the failure kinds of `failures.py` (diverged, spiked, entropy collapse, not learning,
  collapsed). Only a finished run with a failure kind makes an LR not smooth; an LR whose runs
  have none but did not all finish is unknown, and a verdict that depends on it inconclusive.
- **What a sweep cannot support** (`limits`): one seed per setting (no CI, no test), one
  learning rate per setting (no policy at its own best LR), or runs that did not learn (the best
  run is not LEARNED_MARGIN bits per byte below the bigram baseline, or no run finished): each is
  said at the head of every verdict, and a verdict that such a sweep cannot support is inconclusive.
- **Did it act?** (`acted`): a comparison says how much each intervention it compares acted;
  one that acted in none of the compared runs makes the claim "not exercised" (`acted`).
- **Decided at init** (`at_init`): a claim comparing arms says how they start (normalised
  attention entropy and logit std at step 0); when one starts collapsed its verdict line says
  "decided at init".
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence

from scale_ablation.analysis import acted, at_init, intervals, significance, verdict_unstable
from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis.claims import (
    OPPOSITE,
    Arms,
    Band,
    Claim,
    Compare,
    Counts,
    Diverges,
    Trend,
    Unstable,
    Verdict,
    Within,
)
from scale_ablation.analysis.verdict_bands import judge_band
from scale_ablation.analysis.verdict_counts import (
    Counting,
    Divergences,
    Test,
    Trending,
    p_text,
    split_of,
    unit_of,
)
from scale_ablation.analysis.verdict_unstable import judge_unstable

ALPHA = significance.ALPHA
LEARNED_MARGIN = verdict_unstable.LEARNED_MARGIN
EQUIVALENT = "equivalent"


def limits(rows: list[dict], declared: Sequence[Claim] = ()) -> list[str]:
    """What this sweep's design cannot support, computed from its rows (empty: nothing). One LR
    per setting is no limit for claims that compare each policy at an LR located before
    (`Compare(at="own_lr")`) or count failures per LR or d_k (`Diverges`, `Trend`), when every
    declared claim is such a claim."""
    out = []
    seeds: dict = defaultdict(set)
    for r in rows:
        seeds[(cmp.variant(r), r["d_k"])].add(r["seed"])
    if seeds and max(len(s) for s in seeds.values()) < 2:
        out.append("one seed per setting: no confidence interval and no test can be formed")
    # Claims that need no LR grid: comparisons at LRs located before, and counts per LR.
    located = declared and all((isinstance(c.rule, Compare) and c.rule.at == "own_lr")
                               or isinstance(c.rule, (Unstable, Diverges, Trend))
                               or isinstance(getattr(c.rule, "rule", None), (Diverges, Trend))
                               for c in declared)
    if rows and not cmp.has_lr_grid(rows) and not located:
        out.append("one learning rate per setting: no policy is compared at its own best LR")
    bigram = [r["baseline_bigram_bpb"] for r in rows if r.get("baseline_bigram_bpb") is not None]
    values = [v for r in rows if (v := cmp.finished_value(r, "final_val_bpb")) is not None]
    if rows and not cmp.finished_rows(rows):
        out.append(f"no run finished: none of its {len(rows)} runs has a result")
    elif bigram and values and min(values) > min(bigram) - LEARNED_MARGIN:
        out.append(f"no run learned: the best ends at {min(values):.3f} bits per byte, not "
                   f"{LEARNED_MARGIN} below the bigram baseline's {min(bigram):.3f}")
    return out


def _arms(rule: object, rows: list[dict]) -> list[dict]:
    """The rows a rule compares: its policies and its reference (every row when it names no
    policy), at d_k >= its min_d_k."""
    named = set(getattr(rule, "policies", ()) or ())
    if named and getattr(rule, "reference", None):
        named.add(rule.reference)
    return [r for r in rows if (not named or r["policy"] in named)
            and r["d_k"] >= getattr(rule, "min_d_k", 0)]


def _with_finished_count(verdict: Verdict, rule: object, rows: list[dict]) -> Verdict:
    """`verdict` saying how many of its arms' runs finished when some did not; inconclusive
    when none did (no rule can rest on no runs)."""
    arms = _arms(rule, rows)
    done = len(cmp.finished_rows(arms))
    if done == len(arms):
        return verdict
    count = f"{done} of {len(arms)} runs of its arms finished"
    if done == 0:
        return Verdict("inconclusive", f"no run of its arms finished ({count})", verdict.numbers)
    return dataclasses.replace(verdict, reason=f"{verdict.reason} ({count})")


# --------------------------------------------------------------------------- one family of tests


def _adjust(tests: Sequence[Test]) -> None:
    for test, adjusted in zip(tests, significance.holm([t.p for t in tests]), strict=True):
        test.adjusted = adjusted


def _direction(pair: cmp.Paired, higher_is_better: bool) -> str:
    lower = pair.difference.mean < 0
    return "better" if lower != higher_is_better else "worse"


class _Comparison:
    """A Compare rule's paired differences and their tests, decided after the family's Holm."""

    def __init__(self, rule: Compare, rows: list[dict], margin: float | None) -> None:
        rows = [r for r in rows if r["d_k"] >= rule.min_d_k]
        self.rule, self.margin = rule, margin
        self.pairs, self.higher, self.split, self.unit = _pairs(rule, rows)
        self.diverged = [d for d in cmp.diverged_at_same_lr(
            [r for r in rows if r["lr"] >= rule.min_lr], rule.reference)
            if rule.at == "each_lr" and (not rule.policies or d[1] in rule.policies)]
        self.differ = [Test(significance.paired_t_p(p.differences)) for p in self.pairs]
        equivalence = rule.expect == "indistinguishable" and margin is not None
        self.same = [Test(significance.tost_p(p.differences, margin) if equivalence
                           and len(p.differences) >= 2 else math.nan) for p in self.pairs]

    def tests(self) -> list[Test]:
        testable = self.rule.expect == "indistinguishable"
        return [t for t in (*self.differ, *(self.same if testable else ())) if not math.isnan(t.p)]

    def decision(self, i: int) -> str:
        pair = self.pairs[i]
        if pair.decision == intervals.TOO_FEW or len(pair.differences) < 2:
            return intervals.TOO_FEW
        if self.differ[i].adjusted < ALPHA:
            decided = _direction(pair, self.higher)
        elif self.same[i].adjusted < ALPHA:
            decided = EQUIVALENT
        else:
            decided = intervals.UNRESOLVED
        stands = decided in pair.standing or (decided == EQUIVALENT
                                              and intervals.UNRESOLVED in pair.standing)
        return decided if stands else cmp.AT_EDGE

    def verdict(self, caveats: list[str]) -> Verdict:
        numbers = (*(self._line(i) for i in range(len(self.pairs))),
                   *(self._diverged_line(d) for d in self.diverged))
        lrs = ", ".join(sorted({f"{d[3]:.3g}" for d in self.diverged}, key=float))
        if not self.pairs:
            why = (f": every pair has a diverged run (LR {lrs})" if self.diverged
                   else " (missing policies, seeds or LR grid)")
            return Verdict("inconclusive", f"no runs to compare{why}", numbers)
        decisions = [self.decision(i) for i in range(len(self.pairs))]
        expected = EQUIVALENT if self.rule.expect == "indistinguishable" else self.rule.expect
        named = lambda which: "; ".join(  # noqa: E731
            f"{p.variant} d_k={p.d_k}: {d}" for p, d in zip(self.pairs, decisions, strict=True)
            if d in which)
        if against := named(OPPOSITE[self.rule.expect]):
            # A verdict resting on some cells of several says which, and what the rest say.
            k = sum(d in OPPOSITE[self.rule.expect] for d in decisions)
            agree = named({expected})
            rest = f"; as claimed in {sum(d == expected for d in decisions)}: {agree}" if (
                agree) else "; none as claimed"
            share = f" in {k} of {len(decisions)} comparisons" if len(decisions) > 1 else ""
            return Verdict("contradicted", f"decided against the claim{share}: {against}"
                           + (rest if len(decisions) > 1 else ""), numbers)
        if caveats or any(d != expected for d in decisions):
            unresolved = named({d for d in decisions if d != expected})
            return Verdict("inconclusive", "not resolved by the data"
                           + (f": {unresolved}" if unresolved else ""), numbers)
        if self.diverged:  # the pairs left cannot speak for the LRs where runs diverged
            return Verdict("inconclusive", f"runs diverged at LR {lrs}: their pairs cannot "
                           "be compared", numbers)
        return Verdict("supported", f"all {len(decisions)} comparisons are {expected}", numbers)

    def _diverged_line(self, found: tuple) -> str:
        name, _, d_k, lr, k, n, k_ref = found
        return (f"{name}, d_k={d_k}, lr={lr:.3g}: {k} of {n} diverged against "
                f"{self.rule.reference} {k_ref} of {n}; a diverged run has no final value: its "
                "pair is left out (a Diverges claim counts it) and the claim cannot be "
                "supported on the others")

    def _line(self, i: int) -> str:
        p = self.pairs[i]
        where = "" if p.lr is None else f", lr={p.lr:.3g}"
        tost = ""
        if self.rule.expect == "indistinguishable":
            margin = "no margin" if self.margin is None else f"±{self.margin:.3g}"
            tost = f"; TOST {margin}: {p_text(self.same[i])}"
        unit = f" {self.unit}" if self.unit else ""
        return (f"{p.variant}, d_k={p.d_k}{where}: Δ = {p.difference.format(4, unit)} on "
                f"{self.split}; {p_text(self.differ[i])}{tost} → {self.decision(i)}")


def _pairs(rule: Compare, rows: list[dict]) -> tuple[list[cmp.Paired], bool, str, str]:
    """The rule's paired comparisons, whether higher is better, the split they report and the
    unit of their differences."""
    key, higher = cmp.primary_metric(rows)
    if rule.log10 and rule.metric not in ("primary", "lr_sensitivity"):
        rows = cmp.log10_rows(rows, rule.metric)
    if rule.metric == "lr_sensitivity":
        found, split = cmp.paired_sensitivity(rows, rule.reference), "the shared LR grid"
        higher, metric = False, rule.metric
    else:
        chosen = key if rule.metric == "primary" else rule.metric
        # A log10 metric's test counterpart is not log10'd: it reports on what it chose on.
        metric = chosen if rule.log10 else cmp.report_metric(rows, chosen)
        higher = higher if rule.metric == "primary" else False
        split = split_of(metric)
        if rule.at == "own_lr":
            found = _paired_own_lr(rows, rule.reference, metric, higher)
        elif rule.at == "best_lr":
            found = cmp.paired_best_lr(cmp.best_lrs(rows, key, cmp.primary_metric(rows)[1]),
                                       rule.reference, metric, higher)
        else:
            found = cmp.paired_same_lr([r for r in rows if r["lr"] >= rule.min_lr],
                                       rule.reference, metric, higher)
    return ([p for p in found if not rule.policies or p.policy in rule.policies], higher, split,
            unit_of(metric, rule.log10))


def _paired_own_lr(rows: list[dict], reference: str, key: str,
                   higher: bool) -> list[cmp.Paired]:
    """Each setting with one learning rate against the reference's, matched on seed: for
    designs whose LRs were located by an earlier study (the LR is not a swept axis here)."""
    by_setting: dict = defaultdict(dict)
    for r in rows:
        if (v := cmp.finished_value(r, key)) is not None:
            by_setting[(cmp.setting(r), r["policy"], r["d_k"])][r["seed"]] = v
    refs = {d_k: seeds for (_, policy, d_k), seeds in by_setting.items() if policy == reference}
    out = []
    for (name, policy, d_k), seeds in by_setting.items():
        shared = sorted(set(seeds) & set(refs.get(d_k, {}))) if policy != reference else []
        if not shared:
            continue
        values, ref = [seeds[s] for s in shared], [refs[d_k][s] for s in shared]
        diff = intervals.paired(values, ref)
        out.append(cmp.Paired(name, policy, d_k, None, diff,
                              intervals.decide(diff, higher_is_better=higher),
                              differences=tuple(v - r for v, r in zip(values, ref, strict=True))))
    return out


# --------------------------------------------------------------------------- the family


def _flatten(claim: Claim, rows: list[dict]) -> tuple[object, list[dict]]:
    """The claim's rule and rows with Arms resolved to the rule over relabelled rows, Within to
    the rule over its runs."""
    if isinstance(claim.rule, (Arms, Within)):  # interventions read before Arms relabel runs
        return claim.rule.rule, claim.rule.rows(acted.tag(rows))
    return claim.rule, rows


def judge_family(declared: Sequence[Claim], rows: list[dict]) -> list[Verdict]:
    """Every claim's verdict, with Holm's correction over all of the study's tests."""
    caveats = limits(rows, declared)
    key, _ = cmp.primary_metric(rows)
    floor = cmp.noise_floor(rows, cmp.DEFAULT_REFERENCE, key)
    parts, arms = [], []
    for claim in declared:
        rule, every_row = _flatten(claim, rows)
        arms.append((rule, every_row))
        # Unstable sees the unfinished runs too: they make an LR unknown, never rough.
        claim_rows = every_row if isinstance(rule, Unstable) else cmp.finished_rows(every_row)
        if isinstance(rule, Compare):
            margin = rule.margin if rule.margin is not None else (floor and floor.median)
            parts.append(_Comparison(rule, claim_rows, margin))
        elif isinstance(rule, Counts):
            parts.append(Counting(rule, claim_rows))
        elif isinstance(rule, Diverges):
            parts.append(Divergences(rule, claim_rows))
        elif isinstance(rule, Trend):
            parts.append(Trending(rule, claim_rows))
        else:
            parts.append((rule, claim_rows))
    _adjust([t for part in parts if hasattr(part, "tests") for t in part.tests()])
    out = []
    for part, (rule, every_row) in zip(parts, arms, strict=True):
        if hasattr(part, "verdict"):
            verdict = part.verdict(caveats)
        elif hasattr(part[0], "judge"):  # a rule that judges itself (`transfer.Transfer`)
            verdict = part[0].judge(part[1])
        elif isinstance(part[0], Band):
            verdict = judge_band(part[0], part[1])
        else:
            verdict = judge_unstable(part[0], part[1], caveats)
        verdict = acted.annotate(verdict, rule, cmp.finished_rows(every_row))
        verdict = at_init.annotate(verdict, rule, cmp.finished_rows(_arms(rule, every_row)))
        out.append(_with_finished_count(verdict, rule, every_row))
    return out


def judge(claim: Claim, rows: list[dict]) -> Verdict:
    """One claim's verdict, as a family of one."""
    return judge_family([claim], rows)[0]
