"""Did it act? (`analysis.acted`, issue 54) on synthetic run rows: an intervention that acted
in none of the compared runs makes its claim "not exercised" and says where it first acts; one
that acted leaves the verdict as it was, with a line saying how much; one whose rows hold no
evidence leaves it as it was and says so. The thresholds are restated here, not imported."""

from __future__ import annotations

import math

import pytest

from scale_ablation.analysis import acted, verdicts
from scale_ablation.analysis import claims as c
from scale_ablation.claims_table import _VERDICT

SEEDS = (0, 1, 2)
LRS = (1e-3, 3e-3, 1e-2, 3e-2)
# The reference's loss at each LR: the best (3e-3) inside the grid, so that equivalence stands.
BPB = {1e-3: 3.3, 3e-3: 3.1, 1e-2: 3.2, 3e-2: 3.4}


def row(policy: str, lr: float, seed: int, bpb: float, **values) -> dict:
    return {"policy": policy, "d_k": 32, "lr": lr, "seed": seed, "status": "completed",
            "final_val_bpb": bpb, "final_test_bpb": bpb - 0.01, "spike_step": None,
            "collapse_step": None, "override:policy": policy, "override:train.lr": lr,
            "override:train.seed": seed, **values}


def study(arm: str, arm_values, arm_shift=lambda lr: 0.0, ref_values=lambda lr: {}) -> list[dict]:
    """The reference (1/√d_k) and `arm` over LRS × SEEDS: `arm_values(lr)` its row's fields,
    `arm_shift(lr)` its loss against the reference's, times (seed + 1) / 2 (differences that
    vary from seed to seed, as a t-test needs)."""
    rows = []
    for lr in LRS:
        for seed in SEEDS:
            base = BPB[lr] + 0.01 * seed
            rows.append(row("inv_sqrt_dk", lr, seed, base, **ref_values(lr)))
            shifted = base + arm_shift(lr) * (seed + 1) / 2
            rows.append(row(arm, lr, seed, shifted, **arm_values(lr)))
    return rows


def costs_nothing(arm: str) -> c.Claim:
    return c.Claim(f"{arm} costs nothing",
                   c.Compare("indistinguishable", policies=(arm,), margin=0.05))


def judge(claim: c.Claim, rows: list[dict]):
    return verdicts.judge(claim, rows)


def acted_line(found) -> str:
    return next(n for n in found.numbers if n.startswith("did it act?"))


# --------------------------------------------------------------------------- QK-clip


def clipped_from_1e2(lr: float) -> float:
    """The old rows' evidence: the loss moves off the twin's only where the clip fires."""
    return -0.05 if lr >= 1e-2 else 1e-7  # 1e-7: round-off, below acted.ROUND_OFF (1e-5)


def test_a_clip_that_never_fired_at_the_best_lr_is_not_exercised():
    largest = {1e-3: 20.0, 3e-3: 30.3, 1e-2: 60.0, 3e-2: 80.0}  # T = 50 first passed at 1e-2
    rows = study("qk_clip:50", lambda lr: {"max_attention_logit": largest[lr]}, clipped_from_1e2)
    found = judge(costs_nothing("qk_clip:50"), rows)
    assert found.verdict == acted.NOT_EXERCISED, found
    assert "first acts at LR 0.01 (d_k 32)" in found.reason
    assert "(the comparison alone: supported)" in found.reason
    line = acted_line(found)
    assert "compared at LR 0.003, d_k 32" in line and "none of its 3 runs" in line
    assert "reached 30.3 (< T = 50)" in line and "|Δ| ≤ 1.5e-07" in line


def test_a_loss_off_its_twin_beyond_round_off_is_a_clip_the_diagnostics_missed():
    # Every sampled logit below T, but the runs are not the twin's: only a clip can do that.
    rows = study("qk_clip:50", lambda lr: {"max_attention_logit": 30.0}, lambda lr: 2e-5)
    found = judge(costs_nothing("qk_clip:50"), rows)
    assert found.verdict == "supported", found
    assert "yes, in all 3 runs" in acted_line(found)
    assert "by up to 3e-05 bits per byte" in acted_line(found)


@pytest.mark.parametrize(("clips", "expected"), [(0, acted.NOT_EXERCISED), (4, "supported")])
def test_counted_clips_decide_over_sampled_logits(clips, expected):
    rows = study("qk_clip:50", lambda lr: {"max_attention_logit": 10.0, "qk_clip_clips": clips,
                                           "qk_clip_step_share": clips / 400},
                 lambda lr: 0.001)
    found = judge(costs_nothing("qk_clip:50"), rows)
    assert found.verdict == expected, found
    if clips:
        assert "12 head-steps clipped" in acted_line(found) and "1.0% of its" in acted_line(found)
    else:
        assert "no head clipped at any step" in acted_line(found)
        assert "it acts at no LR or d_k of this study's grid" in found.reason


def test_a_clip_without_evidence_is_not_known():
    """No logit recorded and no twin to compare with: nothing says whether it clipped."""
    clip = acted.Intervention("qk_clip", 50.0, "qk_clip:50")
    alone = row("qk_clip:50", 3e-3, 0, 3.1)
    assert acted.evidence(clip, alone, [alone]).state == acted.UNKNOWN
    twin = row("inv_sqrt_dk", 3e-3, 0, 3.1 + 1e-7)
    assert acted.evidence(clip, alone, [alone, twin]).state == acted.IDLE  # its twin's loss


def test_a_cap_without_evidence_leaves_the_verdict_and_says_so():
    rows = study("softcap:30", lambda lr: {}, lambda lr: 0.001)
    found = judge(costs_nothing("softcap:30"), rows)
    assert found.verdict == "supported", found
    assert acted_line(found).endswith("not known for its 3 runs")


# --------------------------------------------------------------------------- soft-cap


KNEE = 30 * math.tanh(0.5)  # 13.86: the knee |z| = C/2 = 15 after a cap of 30


@pytest.mark.parametrize(("largest", "expected"),
                         [(KNEE - 0.1, acted.NOT_EXERCISED), (KNEE + 0.1, "supported")])
def test_a_cap_is_judged_on_its_largest_logit_against_the_knee(largest, expected):
    rows = study("softcap:30", lambda lr: {"max_attention_logit": largest if lr < 1e-2 else 30.0},
                 lambda lr: 0.001)
    found = judge(costs_nothing("softcap:30"), rows)
    assert found.verdict == expected, found
    before = 30 * math.atanh(largest / 30)  # what the cap made of it, undone
    assert f"was {largest:.3g} ({before:.3g} before it)" in acted_line(found)
    if expected == acted.NOT_EXERCISED:
        assert "short of the knee |z| > C/2 = 15" in acted_line(found)
        assert "first acts at LR 0.01 (d_k 32)" in found.reason


@pytest.mark.parametrize(("share", "expected"), [(0.0, acted.NOT_EXERCISED), (2e-4, "supported")])
def test_a_cap_with_its_share_past_the_knee_logged(share, expected):
    rows = study("softcap:30", lambda lr: {"max_attention_logit": 20.0,
                                           "softcap_past_knee": share}, lambda lr: 0.001)
    found = judge(costs_nothing("softcap:30"), rows)
    assert found.verdict == expected, found
    assert f"at most {share:.3%} of the logits" in acted_line(found)


# --------------------------------------------------------------------------- z-loss (arms)


def z_loss_rows(share: float | None) -> list[dict]:
    rows = []
    for lr in LRS:
        for seed in SEEDS:
            base = BPB[lr] + 0.01 * seed
            rows.append(row("inv_sqrt_dk", lr, seed, base, **{"override:train.z_loss": 0.0}))
            extra = {} if share is None else {"z_loss_share": share}
            rows.append(row("inv_sqrt_dk", lr, seed, base + 0.001 * (seed + 1) / 2,
                            **{"override:train.z_loss": 1e-4}, **extra))
    return rows


Z_CLAIM = c.Claim("z-loss costs nothing", c.Arms(
    c.Compare("indistinguishable", policies=("0.0001",), reference="0.0", margin=0.05),
    field="train.z_loss", policies=("inv_sqrt_dk",)))


@pytest.mark.parametrize(("share", "expected", "said"), [
    (0.0, acted.NOT_EXERCISED, "no, in none of its 3 runs"),  # log Z = 0: nothing to pull
    (2.8e-3, "supported", "yes, in all 3 runs"),  # stabilisers' z-loss 1e-4 at its best LR
    (None, "supported", "not known for its 3 runs"),  # runs before the share was logged
])
def test_a_z_loss_arm_by_its_share_of_the_objective(share, expected, said):
    found = judge(Z_CLAIM, z_loss_rows(share))
    assert found.verdict == expected, found
    line = acted_line(found)
    assert line.startswith("did it act? z-loss 0.0001 (compared at LR 0.003") and said in line
    if share is None:
        assert "not recorded for these runs" in line


# --------------------------------------------------------------------------- learned scale


@pytest.mark.parametrize(("factor", "expected"), [(1.005, acted.NOT_EXERCISED), (2.0, "supported")])
def test_a_learned_scale_by_how_far_it_moved_from_its_start(factor, expected):
    start = 1 / math.sqrt(32)  # `learned` starts at 1/√d_k
    rows = study("learned", lambda lr: {"final_learned_scale": start * factor},
                 lambda lr: 0.001)
    found = judge(costs_nothing("learned"), rows)
    assert found.verdict == expected, found
    assert f"ended at ×{factor:.3g} its start" in acted_line(found)


def test_a_learned_scale_given_its_start_is_measured_from_it():
    rows = study("learned:1.0", lambda lr: {"final_learned_scale": 1.004}, lambda lr: 0.001)
    assert judge(costs_nothing("learned:1.0"), rows).verdict == acted.NOT_EXERCISED


def test_a_learned_scale_that_logged_no_final_value_is_not_known():
    for missing in ({}, {"final_learned_scale": None}, {"final_learned_scale": 0.0}):
        rows = study("learned", lambda lr, m=missing: dict(m), lambda lr: 0.001)
        found = judge(costs_nothing("learned"), rows)
        # Nothing measured: the comparison's own verdict stands, and the line says no more.
        assert found.verdict == "supported", found
        assert acted_line(found).endswith(": not known for its 3 runs")


# --------------------------------------------------------------------------- loss scale


def test_a_loss_scale_always_acts_and_reports_its_skipped_steps():
    rows = []
    for lr in (1e-2, 3e-2):
        for seed in SEEDS:
            for period, diverged in (("0", lr == 3e-2), ("200", False)):
                skipped = {"skipped_steps": 3 + seed} if period == "200" else {}
                rows.append({**row("inv_sqrt_dk", lr, seed, 3.2),
                             "status": "diverged" if diverged else "completed",
                             "override:train.loss_scale_period": period, **skipped})
    rule = c.Arms(c.Diverges("more", ("0",), "200"), field="train.loss_scale_period")
    found = judge(c.Claim("loss scaling helps", rule), rows)
    line = acted_line(found)
    assert found.verdict != acted.NOT_EXERCISED
    assert "dynamic loss scale (period 200)" in line and "yes, in all 6 runs" in line
    assert f"skipped {sum(3 + s for s in SEEDS) * 2:g} steps in all (5 at most" in line


def test_a_static_loss_scale_and_unreadable_overrides():
    assert acted.interventions({"policy": "inv_sqrt_dk", "override:train.loss_scale": "1024"}) == (
        acted.Intervention("loss_scale", 0.0, "static loss scale 1024"),)
    # 1 and 0 scale nothing; a value that is no number is no intervention either.
    for value in ("0", "", None, "abc", [3]):
        assert acted.interventions({"policy": "inv_sqrt_dk", "override:train.loss_scale": value,
                                    "override:train.z_loss": value}) == ()
    for value in ("1", 1.0):  # a static scale of 1 multiplies by one
        assert acted.interventions({"policy": "inv_sqrt_dk",
                                    "override:train.loss_scale": value}) == ()


def test_a_loss_scale_whose_skipped_steps_were_not_recorded_says_so():
    rows = []
    for lr in (1e-2, 3e-2):
        for seed in SEEDS:
            for period, diverged in (("0", lr == 3e-2), ("200", False)):
                rows.append({**row("inv_sqrt_dk", lr, seed, 3.2),
                             "status": "diverged" if diverged else "completed",
                             "override:train.loss_scale_period": period})
    rule = c.Arms(c.Diverges("more", ("0",), "200"), field="train.loss_scale_period")
    line = acted_line(judge(c.Claim("loss scaling helps", rule), rows))
    assert line.endswith("yes, in all 6 runs: it multiplies every step's loss; the steps it "
                         "skipped were not recorded for these runs (before issue 54)")


# --------------------------------------------------------------------------- scope


def test_only_the_interventions_that_differ_between_the_arms_are_reported():
    """Both arms clip: the claim compares something else, and says nothing of the clip."""
    rows = [{**r, "policy": "qk_clip:50+" + r["policy"] if r["policy"] != "inv_sqrt_dk"
             else "qk_clip:50", "max_attention_logit": 10.0}
            for r in study("softcap:30", lambda lr: {}, lambda lr: 0.001)]
    claim = c.Claim("x", c.Compare("indistinguishable", policies=("qk_clip:50+softcap:30",),
                                   reference="qk_clip:50", margin=0.05))
    lines = [n for n in judge(claim, rows).numbers if n.startswith("did it act?")]
    assert len(lines) == 1 and lines[0].startswith("did it act? softcap:30"), lines


def test_policies_without_an_intervention_leave_the_verdict_untouched():
    rows = study("none", lambda lr: {"max_attention_logit": 10.0}, lambda lr: 0.001)
    found = judge(costs_nothing("none"), rows)
    assert found.verdict == "supported" and not any("did it act" in n for n in found.numbers)


def test_the_claims_table_reads_the_two_word_verdict():
    text = ("Verdict: **not exercised**: qk_clip:50 did not act in the 3 compared runs "
            "(LR 0.00316, d_k 32); it first acts at LR 0.01 (d_k 32) (the comparison alone: "
            "supported).")
    found = _VERDICT.search(text)
    assert found.group(1) == acted.NOT_EXERCISED and found.group(2).startswith("qk_clip:50")
