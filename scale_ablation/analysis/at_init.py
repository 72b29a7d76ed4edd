"""Decided at init: a comparison whose outcome was known before the first step (issue 54).

Some comparisons are foregone: scale 1 at d_k 128 under fan_in starts with a logit std of
√128 ≈ 11 and an attention close to one-hot, and a run that starts there either never learns or
spends its budget leaving it. Its verdict is then a fact about the initialisation, not about
training. Every claim that compares arms (`Compare`, `Unstable`, `Diverges`, `Counts`) says what
its arms looked like at step 0, before any update, from the diagnostics pass each run logs
there (`initial_entropy_normalised`: the lowest layer's mean normalised attention entropy,
`initial_logit_std`: the largest layer's mean logit std; `report.summarise_run`).

**The rule.** An arm (a policy, or a relabelled arm, with its other settings, at one d_k; its
LRs together) *starts collapsed* when the median over its finished runs of the normalised
entropy at step 0 is below COLLAPSED_ENTROPY or of the logit std at step 0 is LARGE_LOGIT_STD or
more. A comparison is separated at init when one side starts collapsed and the other does not
(an arm against the reference's arm of the same settings and d_k; for `Unstable`, each arm on
its own). A claim all of whose comparisons are so separated is **decided at init**; one where
some are is **partly decided at init**; arms that start collapsed alike (float16 against float32
logits, both under scale 1) decide nothing. The verdict stands either way (the runs still say
what happened); the verdict line says which beside it, and a line names the collapsed arms. The
claims table and the README's index flag only the whole kind.
Runs recorded before step 0's
diagnostics were summarised have neither field: their arms are not judged (a claim with none
says nothing about step 0; one with some says how many runs were left out).
Rules that judge a curve over the whole grid (the exponent, transfer, bands) are not arm
comparisons: a collapsed extreme of the grid is a point of the curve, not a foregone verdict.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Sequence

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis.claims import Compare, Counts, Diverges, Trend, Unstable, Verdict

COLLAPSED_ENTROPY = 0.2  # normalised: 1 is uniform attention, 0 one-hot
LARGE_LOGIT_STD = 8.0  # e^8 ≈ 3000: one key outweighs the rest of a 64-key row from the start
DECIDED_AT_INIT = "decided at init"
PARTLY = "partly decided at init"
ENTROPY, LOGIT_STD = "initial_entropy_normalised", "initial_logit_std"
_ARM_RULES = (Compare, Unstable, Diverges, Counts, Trend)


@dataclasses.dataclass(frozen=True)
class ArmAtInit:
    """An arm's attention at step 0: medians over its runs."""

    name: str
    policy: str
    entropy: float
    logit_std: float
    runs: int

    @property
    def collapsed(self) -> bool:
        return self.entropy < COLLAPSED_ENTROPY or self.logit_std >= LARGE_LOGIT_STD

    def text(self) -> str:
        return (f"{self.name}: normalised entropy {self.entropy:.2f}, logit std "
                f"{self.logit_std:.2f} (median of {self.runs})")


def arms_at_init(rows: Sequence[dict]) -> tuple[list[ArmAtInit], int]:
    """Each arm of `rows` (a setting at one d_k, its LRs together: an LR acts only after step 0)
    with its step-0 medians, and how many rows had no step-0 fields."""
    found: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    missing = 0
    for r in rows:
        if r.get(ENTROPY) is None or r.get(LOGIT_STD) is None:
            missing += 1
            continue
        found[(f"{cmp.setting(r)} d_k={r['d_k']}", r["policy"])].append((r[ENTROPY],
                                                                           r[LOGIT_STD]))
    arms = [ArmAtInit(name, policy, statistics.median(e for e, _ in values),
                      statistics.median(s for _, s in values), len(values))
            for (name, policy), values in sorted(found.items())]
    return arms, missing


def _deciding(arms: list[ArmAtInit], reference: str | None) -> tuple[list, int]:
    """(the collapsed arms that separate a comparison at step 0, how many comparisons there
    are). With a reference, each other arm is paired with the reference's arm of the same other
    settings and d_k: a pair counts when exactly one of the two starts collapsed (both collapsed
    start alike: float16 against float32 logits under scale 1, say). Without one (`Unstable`,
    `Trend`), every arm is compared on its own."""
    if reference is None:
        return [a for a in arms if a.collapsed], len(arms)
    refs = {a.name[len(a.policy):]: a for a in arms if a.policy == reference}
    pairs = [(a, refs[a.name[len(a.policy):]]) for a in arms
             if a.policy != reference and a.name[len(a.policy):] in refs]
    return [a if a.collapsed else r for a, r in pairs if a.collapsed != r.collapsed], len(pairs)


def annotate(verdict: Verdict, rule: object, rows: Sequence[dict]) -> Verdict:
    """`verdict` with its arms' state at step 0 as a line and, when a collapse at step 0
    separates what it compares, marked (partly) decided at init (module docstring). `rows`: the
    rows of the claim's arms, finished runs only."""
    if not isinstance(rule, _ARM_RULES) or not rows:
        return verdict
    arms, missing = arms_at_init(rows)
    if not arms:  # rows without step 0's fields (synthetic ones, or a run that logged none)
        return verdict
    unknown = f"; {missing} runs without step-0 fields not judged" if missing else ""
    deciding, compared = _deciding(arms, getattr(rule, "reference", None))
    if not deciding:
        low = min(arms, key=lambda a: a.entropy)
        high = max(arms, key=lambda a: a.logit_std)
        extremes = (f"lowest entropy and largest logit std {low.text()}" if low == high else
                    f"lowest entropy {low.text()}; largest logit std {high.text()}")
        alike = sum(a.collapsed for a in arms)
        state = (f"no collapse at step 0 separates the arms compared ({alike} of {len(arms)} "
                 "arms start collapsed alike)" if alike else "at step 0 no arm starts collapsed")
        line = (f"{state} (collapsed: normalised entropy < {COLLAPSED_ENTROPY} or logit std ≥ "
                f"{LARGE_LOGIT_STD:g}): {extremes}{unknown}")
        return dataclasses.replace(verdict, numbers=(*verdict.numbers, line))
    mark = DECIDED_AT_INIT if len(deciding) == compared else PARTLY
    line = (f"{mark}: in {len(deciding)} of {compared} comparisons one side starts collapsed "
            f"(normalised entropy < {COLLAPSED_ENTROPY} or logit std ≥ {LARGE_LOGIT_STD:g} at "
            "step 0): " + "; ".join(a.text() for a in deciding) + unknown)
    return dataclasses.replace(verdict, numbers=(*verdict.numbers, line), at_init=mark)
