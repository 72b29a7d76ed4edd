"""Arms of a swept field compared like two policies (`claims.Arms` over `claims.Compare`), on
synthetic rows with known answers (the paired differences checked against scipy)."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sps

from scale_ablation.analysis import claims, verdicts
from scale_ablation.analysis.comparisons import AT_EDGE

LRS, SEEDS = (3e-4, 1e-3, 3e-3, 1e-2), (0, 1, 2)  # both arms' best LRs are interior
SEED_EFFECT = (0.03, -0.02, 0.01)
OWN_NOISE = (0.004, -0.003, 0.001)


def bpb(policy: str, norm: str, lr: float, seed: int) -> float:
    """post is 0.05 worse than pre at its own best LR, which is 1e-3 (pre's is 3e-3)."""
    best = 3e-3 if norm == "pre" else 1e-3
    x = math.log10(lr / best)
    value = 2.9 + 0.2 * x * x + SEED_EFFECT[seed]
    if norm == "post":
        value += 0.05 + OWN_NOISE[seed]
    if policy == "logit_layernorm" and norm == "post":
        value -= 1.0  # would reverse the verdict if another policy's runs leaked in
    return value


def row(policy: str, norm: str, lr: float, seed: int) -> dict:
    return {"name": f"{policy},{norm},{lr},{seed}", "policy": policy, "d_k": 32, "lr": lr,
            "seed": seed, "task": "lm", "status": "completed",
            "final_val_bpb": bpb(policy, norm, lr, seed), "override:policy": policy,
            "override:model.norm_position": norm, "override:train.lr": lr,
            "override:train.seed": seed}


def field_rule(expect: str, field: str, value, reference_value,
               policy: str = "inv_sqrt_dk") -> claims.Arms:
    return claims.Arms(claims.Compare(expect, policies=(str(value),),
                                      reference=str(reference_value)),
                       field=field, policies=(policy,))


ROWS = [row(p, n, lr, s) for p in ("inv_sqrt_dk", "logit_layernorm") for n in ("pre", "post")
        for lr in LRS for s in SEEDS]


def test_post_against_pre_each_at_its_own_best_lr():
    rule = field_rule("worse", "model.norm_position", "post", "pre")
    verdict = verdicts.judge(claims.Claim("post-norm ends worse", rule), ROWS)
    differences = [bpb("inv_sqrt_dk", "post", 1e-3, s) - bpb("inv_sqrt_dk", "pre", 3e-3, s)
                   for s in SEEDS]
    mean = sum(differences) / len(differences)
    half = sps.t.ppf(0.975, len(SEEDS) - 1) * sps.sem(differences)
    assert verdict.verdict == "supported", verdict
    p = sps.ttest_1samp(differences, 0.0).pvalue  # a family of one: Holm leaves it as it is
    assert verdict.numbers == (
        f"post (scale_policy=inv_sqrt_dk), d_k=32: Δ = {mean:.4f} ± {half:.4f} bits per byte (n=3) "
        f"on the "
        f"validation split; p = {p:.3g}, Holm {p:.3g} → worse",)
    assert "arms are values of model.norm_position" in rule.describe()


def test_a_best_lr_on_the_grid_edge_keeps_only_what_a_wider_grid_cannot_reverse():
    # Without 3e-4, post's best (1e-3) is its grid's lowest LR: it may do better below it.
    rows = [r for r in ROWS if r["lr"] >= 1e-3]
    worse = verdicts.judge(claims.Claim("x", field_rule("worse", "model.norm_position", "post",
                                                      "pre")), rows)
    assert worse.verdict == "inconclusive" and worse.numbers[0].endswith(f"→ {AT_EDGE}"), worse
    # Pre against post as the reference at its edge: "pre is better" may not survive either.
    better = verdicts.judge(claims.Claim("x", field_rule("better", "model.norm_position", "pre",
                                                       "post")), rows)
    assert better.verdict == "inconclusive" and better.numbers[0].endswith(f"→ {AT_EDGE}")
    # logit_layernorm's post is better than its pre already at the edge: further can only help.
    stands = field_rule("worse", "model.norm_position", "post", "pre", policy="logit_layernorm")
    found = verdicts.judge(claims.Claim("x", stands), rows)
    assert found.verdict == "contradicted" and found.numbers[0].endswith("→ better"), found


def test_the_other_policy_alone_decides_its_own_claim():
    rule = field_rule("worse", "model.norm_position", "post", "pre",
                      policy="logit_layernorm")
    assert verdicts.judge(claims.Claim("x", rule), ROWS).verdict == "contradicted"


@pytest.mark.parametrize("field", ["model.init_gain", "model.norm_position"])
def test_no_runs_with_the_values_is_inconclusive(field):
    rule = field_rule("worse", field, 4.0, 1.0)
    assert verdicts.judge(claims.Claim("x", rule), ROWS).verdict == "inconclusive"


def test_on_another_metric_than_the_lrs_were_chosen_on_an_edge_decides_nothing():
    """A wider grid can move a secondary metric either way: logit_layernorm's post, better
    than its pre at the edge in the LR-choosing metric (decided above), is not established in a
    second metric that copies it, nor with the roles swapped; with interior best LRs it is."""
    def with_copy(rows):
        return [{**r, "final_copy": r["final_val_bpb"]} for r in rows]

    def rule(value, reference):
        return claims.Arms(claims.Compare("better", policies=(value,), reference=reference,
                                          metric="final_copy"),
                           field="model.norm_position", policies=("logit_layernorm",))

    at_edge = with_copy([r for r in ROWS if r["lr"] >= 1e-3])
    for value, reference in (("post", "pre"), ("pre", "post")):
        found = verdicts.judge(claims.Claim("x", rule(value, reference)), at_edge)
        assert found.verdict == "inconclusive", found
        assert found.numbers[0].endswith(f"→ {AT_EDGE}"), found
    interior = verdicts.judge(claims.Claim("x", rule("post", "pre")), with_copy(ROWS))
    assert interior.verdict == "supported" and interior.numbers[0].endswith("→ better")
