"""The claims an experiment tests: the rules, declared; `verdicts.py` judges them.

An experiment file may define `claims(arg) -> list[Claim]`; `report` then writes claims.md with,
per claim, the command, the numbers with their 95% CIs and p-values, and a computed verdict
(supported, contradicted or inconclusive) with its reason. The rules:

Compare: each listed policy against the reference policy, paired by seed (and every other swept
field). `at="best_lr"` compares each at its own best learning rate (chosen on validation data;
needs an LR grid); `at="each_lr"` at every learning rate both ran (from `min_lr` up). The metric
is the sweep's primary one (bits per byte, MQAR recall accuracy; from the test split when the
runs have one), "lr_sensitivity" (Wortsman et al. 2023, per seed) or a run-row key such as
"max_attention_logit". expect="better"/"worse" is decided by a paired t-test, and "no
difference" (expect="indistinguishable") by two one-sided tests against a margin; every test of a
study is Holm-corrected over the study's family (`verdicts.py` states the rules).

Unstable: whether the listed policies train smoothly at some learning rate: at that LR every
run completed with none of the failure kinds of `failures.py`. expect_unstable=True ("diverged
or oscillated") is supported when no listed policy has such an LR at any d_k in range and
contradicted when one does; expect_unstable=False is supported when every listed policy has one
at every d_k, and contradicted when one has none.

Band: where a value ends relative to a policy's scale at each d_k (the learned scale against
1/√d_k): the 95% CI over seeds of the ratio's geometric mean inside [1/factor, factor].

Counts: solved fractions for bimodal outcomes (MQAR), Wilson intervals and Fisher's exact test.

Diverges: how many runs diverged at each learning rate, the listed policies (or arms) against the
reference, by Fisher's exact test.

Trend: whether a failure kind (diverged, by default) becomes more (or less) frequent as d_k
grows, over the listed policies' (or arms') runs, by the exact conditional trend test: one test
across the d_k where Diverges and Unstable judge one d_k at a time.

Within: a Compare, Unstable or Diverges rule over the runs with given overrides alone.
Arms: a Compare, Unstable or Diverges rule whose "policies" are the values of one swept field
(float32 against activation-dtype logits), restricted to runs with given overrides, scale
policies and learning rates.
"""

from __future__ import annotations

import dataclasses

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import failures

OPPOSITE = {"better": ("worse",), "worse": ("better",),
            "indistinguishable": ("better", "worse")}


def quoted(policies: tuple[str, ...]) -> str:
    """Policy names as code in a rule's text: `none` (scale 1) must not read as "no policy"."""
    return ", ".join(f"`{p}`" for p in policies)


@dataclasses.dataclass(frozen=True)
class Compare:
    expect: str  # "better" | "worse" | "indistinguishable": the policy against the reference
    policies: tuple[str, ...] = ()  # empty: every policy in the sweep but the reference
    reference: str = cmp.DEFAULT_REFERENCE
    metric: str = "primary"  # "primary" | "lr_sensitivity" | a run-row key
    at: str = "best_lr"  # "best_lr" | "each_lr" | "own_lr" (one LR per setting, located before)
    min_d_k: int = 0
    min_lr: float = 0.0  # at="each_lr": only learning rates >= this
    log10: bool = False  # compare log10 of the metric (heavy-tailed ones: max |logit|)
    # expect="indistinguishable": the equivalence margin of the TOST, in the metric's units;
    # None: the study's noise floor (median seed-to-seed std of the reference's final metric).
    margin: float | None = None

    def __post_init__(self) -> None:
        if self.expect not in OPPOSITE:
            raise ValueError(f"Compare.expect must be one of {sorted(OPPOSITE)}, got {self.expect!r}")
        if self.at not in ("best_lr", "each_lr", "own_lr"):
            raise ValueError(f"Compare.at must be best_lr, each_lr or own_lr, got {self.at!r}")

    def describe(self) -> str:
        ref = quoted((self.reference,))
        who = quoted(self.policies) or f"every policy but {ref}"
        if self.metric == "lr_sensitivity":
            where = "each seed's curve over the LRs every setting ran"
        elif self.at == "own_lr":
            where = "each at its one learning rate, located by an earlier study"
        elif self.at == "best_lr":
            where = ("each at its own best LR; one on its grid's edge keeps only a decision a "
                     "wider grid cannot reverse")
        else:
            where = "at every shared LR" + (f" >= {self.min_lr:g}" if self.min_lr else "")
        metric = ("final bits per byte (MQAR: recall accuracy), learning rates chosen on the "
                  "validation split and the difference reported on the test split where every "
                  "run has one" if self.metric == "primary" else self.metric)
        metric = f"log10 {metric}" if self.log10 else metric
        dims = f", d_k >= {self.min_d_k}" if self.min_d_k else ""
        test = "paired t-test, Holm-corrected over the study's family"
        if self.expect == "indistinguishable":
            margin = "the noise floor" if self.margin is None else f"{self.margin:g}"
            return (f"supported if {who} is equivalent to {ref} in {metric} within "
                    f"±{margin} (two one-sided tests; {where}{dims}; paired by seed; {test})")
        return (f"supported if {who} is {self.expect} than {ref} in {metric} "
                f"({where}{dims}; paired by seed; {test})")


@dataclasses.dataclass(frozen=True)
class Unstable:
    """Whether the listed policies train smoothly at some learning rate. `kinds` narrows what
    makes an LR rough to those failure kinds (e.g. ("diverged", "spiked"): "exploded or
    oscillated"); empty: every kind of the taxonomy."""

    policies: tuple[str, ...]
    expect_unstable: bool = True
    min_d_k: int = 0
    kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(failures.FAILURE_KINDS))
        if unknown:
            raise ValueError(f"Unstable.kinds: unknown failure kinds {unknown} "
                             f"(known: {', '.join(failures.FAILURE_KINDS)})")

    def describe(self) -> str:
        who = quoted(self.policies)
        dims = f" at d_k >= {self.min_d_k}" if self.min_d_k else ""
        named = (" or ".join(k.replace("_", " ") for k in self.kinds) if self.kinds else
                 "diverged, spiked, collapsed its attention entropy, did not learn or collapsed")
        if self.kinds and self.expect_unstable:
            return f"supported if every learning rate of {who}{dims} has a run that {named}"
        if self.kinds:
            return (f"supported if {who} have a learning rate{dims} at which no run {named}, "
                    "every d_k")
        if self.expect_unstable:
            return (f"supported if {who} train smoothly at no learning rate{dims} (every LR has "
                    f"a run that {named})")
        return f"supported if {who} train smoothly at some learning rate{dims}, every d_k"


@dataclasses.dataclass(frozen=True)
class Counts:
    """Success counts, for a metric whose outcomes are bimodal (an MQAR seed solves the task
    or stays at the context guess): a run succeeds when `metric` >= `success_at`; each policy's
    solved fraction at its best LR against the reference's, by Fisher's exact test."""

    expect: str  # "better" | "worse" | "indistinguishable"
    policies: tuple[str, ...] = ()
    reference: str = cmp.DEFAULT_REFERENCE
    metric: str = "final_val/accuracy"
    success_at: float = 0.9
    min_d_k: int = 0

    def describe(self) -> str:
        ref = quoted((self.reference,))
        who = quoted(self.policies) or f"every policy but {ref}"
        return (f"supported if {who} solves the task ({self.metric} >= {self.success_at:g}) in "
                f"a {self.expect} fraction of runs than {ref} (each at its best LR; "
                "Wilson intervals, Fisher's exact test, Holm-corrected over the study's family)")


@dataclasses.dataclass(frozen=True)
class Diverges:
    """Divergence counts: at each learning rate, how many runs of each listed policy (or arm)
    diverged (a non-finite loss) against the reference's runs at that LR and d_k, every scale
    policy and seed among the rows counted together, by Fisher's exact test. Unlike `Unstable`
    it cannot be confounded by the entropy collapse every dtype shows at a too-large LR."""

    expect: str  # "more" | "fewer": the policies' divergences against the reference's
    policies: tuple[str, ...]
    reference: str

    def __post_init__(self) -> None:
        if self.expect not in ("more", "fewer"):
            raise ValueError(f"Diverges.expect must be more or fewer, got {self.expect!r}")

    def describe(self) -> str:
        who, ref = quoted(self.policies), quoted((self.reference,))
        nothing = (f"contradicted if no run of {who} diverged" if self.expect == "more" else
                   f"inconclusive if no run of {ref} diverged (nothing to cure)")
        return (f"supported if {who} diverge in {self.expect} runs than {ref} at "
                f"some learning rate and in {OPPOSITE_COUNT[self.expect]} at none (each LR's "
                f"runs counted over scale policies and seeds; Fisher's exact test, "
                f"Holm-corrected over the study's family); {nothing}")


OPPOSITE_COUNT = {"more": "fewer", "fewer": "more"}


@dataclasses.dataclass(frozen=True)
class Trend:
    """Whether the share of runs with a failure of `kinds` grows (or falls) with d_k: the
    finished runs of the listed policies (or arms), every LR and seed among the rows together,
    one group per d_k in increasing order, by the exact conditional trend test
    (`significance.exact_trend_p`, scores the d_k's ranks). Narrow the LRs with `Arms.min_lr`
    to where the failure can happen at all."""

    expect: str  # "grows" | "falls"
    policies: tuple[str, ...]
    kinds: tuple[str, ...] = ("diverged",)

    def __post_init__(self) -> None:
        if self.expect not in ("grows", "falls"):
            raise ValueError(f"Trend.expect must be grows or falls, got {self.expect!r}")
        unknown = sorted(set(self.kinds) - set(failures.FAILURE_KINDS))
        if not self.kinds or unknown:
            raise ValueError(f"Trend.kinds: unknown or no failure kinds {unknown} "
                             f"(known: {', '.join(failures.FAILURE_KINDS)})")

    def describe(self) -> str:
        named = " or ".join(k.replace("_", " ") for k in self.kinds)
        return (f"supported if the share of runs of {quoted(self.policies)} that {named} "
                f"{self.expect} with d_k (its runs at each d_k counted over LRs, scale policies "
                "and seeds; the exact conditional trend test over the d_k in order, two-sided, "
                "Holm-corrected over the study's family); contradicted if it is decided the "
                f"other way; inconclusive if no run {named}")


@dataclasses.dataclass(frozen=True)
class Claim:
    text: str  # the article's claim, in its words
    rule: Compare | Unstable | Band | Arms | Within | Counts | Diverges | Trend
    source: str = ""  # where it is made, e.g. "article §1"


@dataclasses.dataclass(frozen=True)
class Verdict:
    verdict: str  # supported | contradicted | inconclusive | not exercised
    reason: str
    numbers: tuple[str, ...]
    at_init: str = ""  # "", or (partly) decided at init: an arm compared starts collapsed


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


@dataclasses.dataclass(frozen=True)
class Arms:
    """A `Compare`, `Unstable` or `Diverges` rule over the values of one swept field (the arms,
    e.g. `model.logits_dtype`: "float32", "activation") instead of over scale policies: the rule's
    `policies` and `reference` name arms, and a run is paired with the run of the reference arm
    that matches it in everything else (scale policy, seed, LR, other fields). Only the runs
    with every `where` override, of the listed scale `policies` (empty: all) and at LR >=
    `min_lr` take part."""

    rule: Compare | Unstable | Diverges | Trend
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


@dataclasses.dataclass(frozen=True)
class Within:
    """A `Compare`, `Unstable` or `Diverges` rule over the runs with every `where` override
    alone (e.g. (("model.init", "gpt2"),): one init's runs), policies kept as they are."""

    rule: Compare | Unstable | Diverges | Trend
    where: tuple[tuple[str, object], ...]

    @property
    def policies(self) -> tuple[str, ...]:
        return self.rule.policies

    @property
    def reference(self) -> str | None:
        return getattr(self.rule, "reference", None)

    def describe(self) -> str:
        scope = "; ".join(f"{k}={v}" for k, v in self.where)
        return f"runs with {scope}: {self.rule.describe()}"

    def rows(self, rows: list[dict]) -> list[dict]:
        return [r for r in rows
                if all(str(r.get(f"override:{k}")) == str(v) for k, v in self.where)]
