"""Claims an experiment tests, and the rules that decide their verdicts from its runs.

An experiment file may define `claims(arg) -> list[Claim]`; `report` then writes claims.md with,
per claim, the command, the numbers with their 95% CIs and a verdict (supported, contradicted or
inconclusive) with its reason. Four rules:

Compare: each listed policy against the reference policy, paired by seed (and every other swept
field). `at="best_lr"` compares each at its own best learning rate (needs an LR grid);
`at="each_lr"` at every learning rate both ran (from `min_lr` up). The metric is the sweep's
primary one (bits per byte; MQAR: recall accuracy), "lr_sensitivity" (Wortsman et al. 2023,
per seed) or a run-row key such as "max_attention_logit". Each comparison is "better", "worse"
or "indistinguishable" by whether its CI excludes 0. Verdict: supported when every comparison is
the expected one; contradicted when one is decided the other way (for "indistinguishable":
when one is decided either way); otherwise inconclusive.

Unstable: whether the listed policies train smoothly at some learning rate: at that LR every
run completed with no spike and no collapse (`instability.py`). expect_unstable=True ("diverged
or oscillated") is supported when no listed policy has such an LR at any d_k in range and
contradicted when one does; expect_unstable=False is supported when every listed policy has one
at every d_k, and contradicted when one has none.

Band: where a value ends relative to a policy's scale at each d_k (the learned scale against
1/√d_k): the 95% CI over seeds of the ratio's geometric mean inside [1/factor, factor].

Arms: a Compare or Unstable rule whose "policies" are the values of one swept field (float32
against activation-dtype logits), restricted to runs with given overrides, scale policies and
learning rates.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.training import experiment_files as experiment

OPPOSITE = {"better": ("worse",), "worse": ("better",),
            "indistinguishable": ("better", "worse")}


@dataclasses.dataclass(frozen=True)
class Compare:
    expect: str  # "better" | "worse" | "indistinguishable": the policy against the reference
    policies: tuple[str, ...] = ()  # empty: every policy in the sweep but the reference
    reference: str = cmp.DEFAULT_REFERENCE
    metric: str = "primary"  # "primary" | "lr_sensitivity" | a run-row key
    at: str = "best_lr"  # "best_lr" | "each_lr"
    min_d_k: int = 0
    min_lr: float = 0.0  # at="each_lr": only learning rates >= this
    log10: bool = False  # compare log10 of the metric (heavy-tailed ones: max |logit|)

    def __post_init__(self) -> None:
        if self.expect not in OPPOSITE:
            raise ValueError(f"Compare.expect must be one of {sorted(OPPOSITE)}, got {self.expect!r}")
        if self.at not in ("best_lr", "each_lr"):
            raise ValueError(f"Compare.at must be best_lr or each_lr, got {self.at!r}")

    def describe(self) -> str:
        who = ", ".join(self.policies) or f"every policy but {self.reference}"
        if self.metric == "lr_sensitivity":
            where = "each seed's curve over the LR grid"
        elif self.at == "best_lr":
            where = ("each at its own best LR; one on its grid's edge keeps only a decision a "
                     "wider grid cannot reverse")
        else:
            where = "at every shared LR" + (f" >= {self.min_lr:g}" if self.min_lr else "")
        metric = ("final validation bits per byte (MQAR: recall accuracy)"
                  if self.metric == "primary" else self.metric)
        metric = f"log10 {metric}" if self.log10 else metric
        dims = f", d_k >= {self.min_d_k}" if self.min_d_k else ""
        relation = "from" if self.expect == "indistinguishable" else "than"
        return (f"supported if {who} is {self.expect} {relation} {self.reference} in {metric} "
                f"({where}{dims}; paired by seed, 95% CI of the difference)")


@dataclasses.dataclass(frozen=True)
class Unstable:
    policies: tuple[str, ...]
    expect_unstable: bool = True
    min_d_k: int = 0

    def describe(self) -> str:
        who = ", ".join(self.policies)
        dims = f" at d_k >= {self.min_d_k}" if self.min_d_k else ""
        if self.expect_unstable:
            return (f"supported if {who} train smoothly at no learning rate{dims} (every LR has a "
                    "diverged, spiked or collapsed run)")
        return f"supported if {who} train smoothly at some learning rate{dims}, every d_k"


@dataclasses.dataclass(frozen=True)
class Claim:
    text: str  # the article's claim, in its words
    rule: Compare | Unstable | Band | Arms
    source: str = ""  # where it is made, e.g. "article §1"


@dataclasses.dataclass(frozen=True)
class Verdict:
    verdict: str  # supported | contradicted | inconclusive
    reason: str
    numbers: tuple[str, ...]


def _comparisons(rule: Compare, rows: list[dict]) -> list[cmp.Paired]:
    rows = [r for r in rows if r["d_k"] >= rule.min_d_k]
    key, higher = cmp.primary_metric(rows)
    if rule.log10 and rule.metric not in ("primary", "lr_sensitivity"):
        rows = cmp.log10_rows(rows, rule.metric)
    if rule.metric == "lr_sensitivity":
        found = cmp.paired_sensitivity(rows, rule.reference)
    else:
        metric = key if rule.metric == "primary" else rule.metric
        higher = higher if rule.metric == "primary" else False
        if rule.at == "best_lr":
            best = cmp.best_lrs(rows, key, cmp.primary_metric(rows)[1])
            found = cmp.paired_best_lr(best, rule.reference, metric, higher)
        else:
            found = cmp.paired_same_lr([r for r in rows if r["lr"] >= rule.min_lr],
                                       rule.reference, metric, higher)
    return [p for p in found if not rule.policies or p.policy in rule.policies]


def _judge_compare(rule: Compare, rows: list[dict]) -> Verdict:
    found = _comparisons(rule, rows)
    numbers = tuple(f"{p.variant}, d_k={p.d_k}{'' if p.lr is None else f', lr={p.lr:.3g}'}: "
                    f"Δ = {p.difference.format(4)} → {p.decision}" for p in found)
    if not found:
        return Verdict("inconclusive", "no runs to compare (missing policies, seeds or LR grid)",
                       numbers)
    against = [p for p in found if p.decision in OPPOSITE[rule.expect]]
    if against:
        names = "; ".join(f"{p.variant} d_k={p.d_k}: {p.decision}" for p in against)
        return Verdict("contradicted", f"decided against the claim: {names}", numbers)
    undecided = [p for p in found if p.decision != rule.expect]
    if undecided:
        names = "; ".join(f"{p.variant} d_k={p.d_k}: {p.decision}" for p in undecided)
        return Verdict("inconclusive", f"not resolved by the data: {names}", numbers)
    return Verdict("supported", f"all {len(found)} comparisons are {rule.expect}", numbers)


def _smooth_lrs(rows: list[dict]) -> dict[tuple[str, int], list[float]]:
    """(policy, d_k) -> the learning rates at which every run completed with no spike or
    collapse (an empty list when there is none)."""
    by_lr: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_lr[(r["policy"], r["d_k"])][r["lr"]].append(r)
    return {group: sorted(lr for lr, runs in lrs.items()
                          if all(r["status"] == "completed" and r.get("spike_step") is None
                                 and r.get("collapse_step") is None for r in runs))
            for group, lrs in by_lr.items()}


def _instability_counts(runs: list[dict]) -> str:
    diverged = sum(r["status"] == "diverged" for r in runs)
    spiked = sum(r.get("spike_step") is not None for r in runs)
    collapsed = sum(r.get("collapse_step") is not None for r in runs)
    return f"{diverged} diverged, {spiked} spiked, {collapsed} collapsed of {len(runs)} runs"


def _judge_unstable(rule: Unstable, rows: list[dict]) -> Verdict:
    rows = [r for r in rows if r["policy"] in rule.policies and r["d_k"] >= rule.min_d_k]
    smooth = _smooth_lrs(rows)
    numbers = tuple(f"{policy}, d_k={d_k}: smooth at LR "
                    f"{', '.join(f'{lr:.3g}' for lr in lrs) or 'none'}; "
                    + _instability_counts([r for r in rows
                                           if (r["policy"], r["d_k"]) == (policy, d_k)])
                    for (policy, d_k), lrs in smooth.items())
    if not smooth:
        return Verdict("inconclusive", "no runs of these policies", numbers)
    trains = [g for g, lrs in smooth.items() if lrs]
    fails = [g for g, lrs in smooth.items() if not lrs]
    if rule.expect_unstable:
        if trains:
            return Verdict("contradicted", "trains smoothly at some LR: "
                           + "; ".join(f"{p} d_k={d}" for p, d in trains), numbers)
        return Verdict("supported", "no learning rate trains smoothly", numbers)
    if fails:
        return Verdict("contradicted", "no learning rate trains smoothly: "
                       + "; ".join(f"{p} d_k={d}" for p, d in fails), numbers)
    return Verdict("supported", "every policy trains smoothly at some learning rate", numbers)


def judge(claim: Claim, rows: list[dict]) -> Verdict:
    if (extra := judge_extra(claim, rows)) is not None:
        return extra
    if isinstance(claim.rule, Compare):
        return _judge_compare(claim.rule, rows)
    return _judge_unstable(claim.rule, rows)


def load_claims(spec: str) -> list[Claim]:
    """The claims the experiment file of `spec` declares (none if it declares none)."""
    module, arg = experiment.load_module(spec)
    return list(module.claims(arg)) if hasattr(module, "claims") else []


def write_claims(spec: str, sweep_dir: str, rows: list[dict], path: str,
                 without_result: int = 0) -> bool:
    """Write claims.md for the experiment's claims; False (nothing written) when it has none.
    `without_result`: the sweep's runs with no result yet, said at the top, since the verdicts
    rest on the others."""
    try:
        declared = load_claims(spec)
    except ValueError:  # the experiment file is not where the sweep ran it from
        return False
    if not declared:
        return False
    lines = [f"# Claims tested by `{spec}`", "",
             f"Command: `python -m scale_ablation.sweep --config={spec} --workdir={sweep_dir}`",
             "", "Verdicts are computed by scale_ablation/analysis/claims.py from the runs' files.", ""]
    if without_result:
        lines += [f"**{without_result} of the sweep's runs have no result yet (summary.md lists "
                  "them): these verdicts rest on the runs that finished.**", ""]
    for i, claim in enumerate(declared, 1):
        verdict = judge(claim, rows)
        lines += [f"## {i}. {claim.text}" + (f" ({claim.source})" if claim.source else ""), "",
                  f"Rule: {claim.rule.describe()}.", "",
                  f"Verdict: **{verdict.verdict}**: {verdict.reason}.", ""]
        lines += [f"- {n}" for n in verdict.numbers] + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return True


# --------------------------------------------------------------------------- bands and arms


ACROSS_BAND = "across the band's edge"


@dataclasses.dataclass(frozen=True)
class Band:
    """Where a run-row value ends relative to a reference value: supported when, for every
    listed policy and d_k, the 95% CI over seeds of the geometric mean of value / reference
    lies inside [1/factor, factor]; contradicted when one lies wholly outside; otherwise (a CI
    across the band's edge, a single seed) inconclusive. The reference is `target`'s scale at
    each d_k (a policy name: "inv_sqrt_dk" gives 1/√d_k). With an LR grid each setting is taken at
    its own best learning rate (the sweep's primary metric); a best LR on the grid's edge leaves
    its setting not established, since a wider grid can move the value either way (the edge
    rule for metrics the LRs were not chosen on, `comparisons._standing`)."""

    factor: float  # the band: [reference/factor, reference·factor]
    policies: tuple[str, ...] = ()  # empty: every policy whose runs have the value
    metric: str = "final_learned_scale"
    target: str = "inv_sqrt_dk"
    min_d_k: int = 0

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"Band.factor must be > 1, got {self.factor!r}")

    def describe(self) -> str:
        who = ", ".join(self.policies) or "every policy with a value"
        dims = f" at d_k >= {self.min_d_k}" if self.min_d_k else ""
        return (f"supported if {self.metric} of {who} ends within a factor {self.factor:g} of "
                f"{self.target}'s scale{dims} (95% CI over seeds of the geometric mean of the "
                "ratio, each setting at its own best LR when there is an LR grid)")


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


def _judge_band(rule: Band, rows: list[dict]) -> Verdict:
    import math

    from scale_ablation.model import policies
    log_factor = math.log10(rule.factor)
    numbers, places = [], {}
    for (name, d_k), (runs, at_edge) in _band_groups(rule, rows).items():
        reference = policies.get(rule.target).base_scale(d_k)
        logs = [math.log10(v / reference) for r in runs
                if (v := cmp.finished_value(r, rule.metric)) is not None and v > 0]
        if not logs:
            continue
        found = cmp.stats.mean_ci(logs)
        if found.half_width is None:
            place = cmp.stats.TOO_FEW
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
                       f"{named((ACROSS_BAND, cmp.stats.TOO_FEW, cmp.AT_EDGE))}", tuple(numbers))
    return Verdict("supported", f"all {len(places)} inside {band}", tuple(numbers))


@dataclasses.dataclass(frozen=True)
class Arms:
    """A `Compare` or `Unstable` rule over the values of one swept field (the arms, e.g.
    `model.logits_dtype`: "float32", "activation") instead of over scale policies: the rule's
    `policies` and `reference` name arms, and a run is paired with the run of the reference arm
    that matches it in everything else (scale policy, seed, LR, other fields). Only the runs
    with every `where` override, of the listed scale `policies` (empty: all) and at LR >=
    `min_lr` take part."""

    rule: Compare | Unstable
    field: str
    where: tuple[tuple[str, object], ...] = ()
    policies: tuple[str, ...] = ()
    min_lr: float = 0.0

    def describe(self) -> str:
        scope = [f"{k}={v}" for k, v in self.where]
        scope += [f"scale policy {', '.join(self.policies)}"] if self.policies else []
        scope += [f"LR >= {self.min_lr:g}"] if self.min_lr else []
        within = f" (runs with {'; '.join(scope)})" if scope else ""
        return f"arms are values of {self.field}{within}; {self.rule.describe()}"

    def rows(self, rows: list[dict]) -> list[dict]:
        """The runs taking part, each relabelled: its arm as `policy`, its scale policy as an
        override (so that pairing matches on it)."""
        arm_key = f"override:{self.field}"
        out = []
        for r in rows:
            if (arm_key not in r or r["lr"] < self.min_lr
                    or (self.policies and r["policy"] not in self.policies)
                    or any(str(r.get(f"override:{k}")) != str(v) for k, v in self.where)):
                continue
            relabelled = {k: v for k, v in r.items() if k != arm_key}
            out.append({**relabelled, "policy": str(r[arm_key]),
                        "override:scale_policy": r["policy"]})
        return out


def judge_extra(claim: Claim, rows: list[dict]) -> Verdict | None:
    """The verdict of a claim whose rule is a `Band` or `Arms`; None for the other rules."""
    if isinstance(claim.rule, Band):
        return _judge_band(claim.rule, rows)
    if isinstance(claim.rule, Arms):
        return judge(Claim(claim.text, claim.rule.rule, claim.source), claim.rule.rows(rows))
    return None
