"""Decided at init (`analysis.at_init`, issue 54): a claim one of whose arms starts collapsed
(normalised entropy < 0.2 or logit std ≥ 8 at step 0, medians over its runs) is marked beside
its verdict; one whose arms all start healthy says so and is not marked; curve rules are never
marked. The thresholds are restated here, not imported; the step-0 fields are computed from
metrics rows by `report.summarise_run` and checked against a count done by hand."""

from __future__ import annotations

import numpy as np
import pytest

from scale_ablation import report
from scale_ablation.analysis import claims as c
from scale_ablation.analysis import claims_markdown, verdicts
from scale_ablation.claims_table import _VERDICT

SEEDS = (0, 1, 2)


def row(policy: str, seed: int, bpb: float, entropy: float | None, std: float | None) -> dict:
    return {"policy": policy, "d_k": 64, "lr": 3e-3, "seed": seed, "status": "completed",
            "final_val_bpb": bpb, "final_test_bpb": bpb, "spike_step": None,
            "collapse_step": None, "override:policy": policy, "override:train.seed": seed,
            "initial_entropy_normalised": entropy, "initial_logit_std": std}


def rows(arm_entropy, arm_std, ref=(0.9, 1.0)) -> list[dict]:
    """The reference and `none` over three seeds; `none` worse by 0.5 ± seed noise. A scalar
    or one value per seed for the arm's step-0 fields."""
    each = lambda v: v if isinstance(v, tuple) else (v,) * len(SEEDS)  # noqa: E731
    out = []
    for seed, entropy, std in zip(SEEDS, each(arm_entropy), each(arm_std), strict=True):
        out.append(row("inv_sqrt_dk", seed, 2.0 + 0.01 * seed, *ref))
        out.append(row("none", seed, 2.5 + 0.03 * seed, entropy, std))
    return out


WORSE = c.Claim("none is worse", c.Compare("worse", policies=("none",), at="own_lr"))
SMOOTH = c.Claim("none is unstable", c.Unstable(policies=("none",)))


def marked(verdict) -> bool:
    return verdict.at_init == "decided at init" and any(n.startswith("decided at init")
                                                        for n in verdict.numbers)


@pytest.mark.parametrize("entropy, std, expected", [
    (0.16, 11.4, True),       # scale 1 at d_k 128 under fan_in (the old main job)
    (0.15, 2.0, True),        # entropy alone
    (0.5, 8.0, True),         # logit std alone, at the threshold
    (0.2, 7.99, False),       # both just inside
    ((0.1, 0.1, 0.9), 1.0, True),   # the median of three is 0.1
    ((0.1, 0.9, 0.9), 1.0, False),  # one run collapsed of three: the median is not
])
def test_an_arm_that_starts_collapsed_marks_the_verdict(entropy, std, expected):
    for claim in (WORSE, SMOOTH):
        found = verdicts.judge(claim, rows(entropy, std))
        assert marked(found) == expected, (claim.text, found)
        if not expected:
            assert any(n.startswith("at step 0 no arm starts collapsed") for n in found.numbers)


def test_the_mark_leaves_the_verdict_and_reaches_the_claims_table(tmp_path):
    data = rows(0.16, 11.4)
    plain = verdicts.judge(WORSE, [{**r, "initial_entropy_normalised": None,
                                    "initial_logit_std": None} for r in data])
    found = verdicts.judge(WORSE, data)
    assert found.verdict == plain.verdict == "supported"
    assert not plain.at_init and plain.numbers == found.numbers[:-1]
    path = tmp_path / "claims.md"
    claims_markdown.write_claims([WORSE], "experiments/x.py", "runs/x", data, str(path))
    line = _VERDICT.search(path.read_text())
    assert line and "decided at init" in line.group(0) and line.group(1) == "supported"
    assert "none d_k=64: normalised entropy 0.16, logit std 11.40 (median of 3)" in \
        path.read_text()


def test_one_collapsed_arm_of_several_marks_it_partly():
    """`none` collapsed at d_k 64, healthy at d_k 16 (another cell of the same claim): partly
    decided at init, which the claims table does not count as the whole kind."""
    data = rows(0.16, 11.4) + [{**r, "d_k": 16, "initial_entropy_normalised": 0.9,
                                "initial_logit_std": 1.0} for r in rows(0.9, 1.0)]
    found = verdicts.judge(WORSE, data)
    assert found.at_init == "partly decided at init"
    assert any(n.startswith("partly decided at init: in 1 of 2 comparisons one side starts "
                            "collapsed") for n in found.numbers)
    reference_collapsed = [{**r, "initial_entropy_normalised": 0.1} if r["policy"] ==
                           "inv_sqrt_dk" and r["d_k"] == 16 else r for r in data]
    assert verdicts.judge(WORSE, reference_collapsed).at_init == "decided at init"


def test_arms_that_start_collapsed_alike_decide_nothing():
    """The reference collapsed as much as the arm (float16 against float32 logits, both under
    scale 1): the comparison is not separated at init, and the line says how many start alike."""
    found = verdicts.judge(WORSE, rows(0.16, 11.4, ref=(0.15, 11.0)))
    assert not found.at_init
    assert any(n.startswith("no collapse at step 0 separates the arms compared (2 of 2 arms "
                            "start collapsed alike)") for n in found.numbers)


def test_curve_rules_are_not_arm_comparisons():
    band = c.Claim("healthy band", c.Band(2.0, policies=("none",), metric="final_logit_std"))
    found = verdicts.judge(band, rows(0.1, 12.0))
    assert not found.at_init and not any("step 0" in n for n in found.numbers)


def test_step_0_fields_from_the_metrics_rows():
    """The lowest layer's normalised entropy and the largest layer's logit std of the step-0
    diagnostics row, not those of a later row."""
    rng = np.random.default_rng(0)
    entropy, std = rng.uniform(0, 1, size=3), rng.uniform(0, 12, size=3)
    step0 = {"step": 0, **{f"attn/layer{i}/entropy_normalised": float(entropy[i])
                           for i in range(3)},
             **{f"attn/layer{i}/logit_std": float(std[i]) for i in range(3)}}
    later = {"step": 50, **{f"attn/layer{i}/entropy_normalised": 0.01 for i in range(3)},
             **{f"attn/layer{i}/logit_std": 99.0 for i in range(3)}}
    found = report._at_step_0([{"step": 0, "val/loss": 5.0}, step0, later])
    assert found == {"initial_entropy_normalised": sorted(entropy)[0],
                     "initial_logit_std": sorted(std)[-1]}
    assert report._at_step_0([later]) == {"initial_entropy_normalised": None,
                                          "initial_logit_std": None}
