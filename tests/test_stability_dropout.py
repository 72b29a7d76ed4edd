"""The stability triangle's dropout leg (experiments/stability_dropout.py, issue 54): its grid is
the design its docstring states, its claims decide known effects on synthetic runs, and its
quick sweep trains (the dropout acting) and reports end to end."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import test_experiments
from helpers import REPO, swept_runs

from experiments import stability, stability_dropout
from scale_ablation.analysis import verdicts
from scale_ablation.training import experiment_files as experiment

SPEC = str(REPO / "experiments" / "stability_dropout.py")


def test_the_cpu_grid_is_the_design():
    points = stability_dropout.sweep("cpu")
    cells = [(p["policy"], p["model.attention_dropout"], p["train.lr"], p["train.seed"])
             for p in points]
    assert sorted(cells) == sorted(itertools.product(
        ("inv_sqrt_dk", "none"), (0.0, 0.1), stability_dropout.CPU_LRS, (0, 1, 2)))
    # The stability study's grid, carried past its top (1e-2) to the large end.
    assert set(stability.CPU_LRS) < set(stability_dropout.CPU_LRS)
    assert max(stability_dropout.CPU_LRS) > max(stability.CPU_LRS) == stability_dropout.LARGE_LR[
        "cpu"]
    base = experiment.load_config(f"{SPEC}:cpu")
    assert (base.train.grad_clip, base.train.warmup_steps, base.model.attention_impl) == (
        1.0, stability.CPU_WARMUP, "reference")
    assert {p["model.head_dim"] for p in points} == {32}
    test_experiments.test_grid_resolves_to_valid_runs(REPO / "experiments" /
                                                      "stability_dropout.py", "cpu")


BEST_LR = 3e-3


def rows(seeds=(0, 1, 2), noise=0.01) -> list[dict]:
    """A row per cpu grid point: a U-shaped loss around 3e-3; with dropout 1/√d_k ends 0.1 bits
    per byte lower and its largest weight 0.1 lower at every LR, and its LR 1e-2 smooth where
    without dropout one seed collapses its attention there; every LR above 1e-2 and every scale-1
    LR is rough (not learning, entropy collapse) in both arms; nothing diverges."""
    rng = np.random.default_rng(0)
    out = []
    for point in stability_dropout.sweep("cpu"):
        if point["train.seed"] not in seeds:
            continue
        policy, lr, seed = point["policy"], point["train.lr"], point["train.seed"]
        dropout = point["model.attention_dropout"] > 0
        helped = policy == "inv_sqrt_dk" and dropout
        bpb = (2.7 if policy == "inv_sqrt_dk" else 3.5) + 0.3 * math.log10(lr / BEST_LR) ** 2
        bpb += rng.normal(0, noise) - (0.1 if helped else 0.0)
        if policy == "none" or lr > 1e-2:
            failures = "entropy_collapsed;not_learning"
        else:
            failures = "entropy_collapsed" if lr == 1e-2 and not dropout and seed == 1 else ""
        out.append({"policy": policy, "d_k": 32, "lr": lr, "seed": seed, "status": "completed",
                    "failures": failures, **{f"override:{k}": v for k, v in point.items()},
                    "final_val_bpb": bpb, "baseline_bigram_bpb": 3.59,
                    "final_max_weight": 0.6 - (0.1 if helped else 0.0) + rng.normal(0, noise)})
    return out


def test_the_claims_decide_known_effects():
    declared = stability_dropout.claims("cpu")
    found = {c.text: v.verdict for c, v in
             zip(declared, verdicts.judge_family(declared, rows()), strict=True)}
    expected = {
        "Without attention dropout training ends worse (1/√d_k)": "supported",
        "Attention dropout smooths the attention weights: with it the final largest attention "
        "weight is lower (1/√d_k, each arm at its own best LR)": "supported",
        "Without attention dropout, 1/√d_k trains smoothly at no learning rate >= 0.01":
            "supported",
        "With attention dropout, 1/√d_k trains smoothly at some learning rate >= 0.01":
            "supported",
        "Without attention dropout, scale 1 trains smoothly at no learning rate >= 0.01":
            "supported",
        "With attention dropout, scale 1 trains smoothly at some learning rate >= 0.01":
            "contradicted",
        "Attention dropout prevents divergence: more runs diverge without it than with it at "
        "LR >= 0.01 (scale 1 and 1/√d_k counted together)": "contradicted",
    }
    assert {text: found[text] for text in expected} == expected
    # No effect on scale 1's loss or weights: neither is decided for it.
    assert found["Without attention dropout training ends worse (scale 1)"] == "inconclusive"
    # One seed per setting forms no test: nothing about the loss is supported.
    one = verdicts.judge_family(declared, rows(seeds=(0,)))
    assert not any(v.verdict == "supported" for c, v in zip(declared, one, strict=True)
                   if "ends worse" in c.text or "lower" in c.text)


def test_the_dropout_arm_is_paired_with_the_run_of_its_seed():
    """The loss claim's difference at the best LR is the mean over seeds of without − with
    dropout at that LR (NumPy here)."""
    declared = stability_dropout.claims("cpu")
    claim = declared[0]
    assert claim.text == "Without attention dropout training ends worse (1/√d_k)"
    data = rows()
    found = verdicts.judge_family([claim], data)[0]

    def values(rate: float) -> list[float]:
        return [r["final_val_bpb"] for r in sorted(data, key=lambda r: r["seed"])
                if r["policy"] == "inv_sqrt_dk" and r["lr"] == BEST_LR
                and r["override:model.attention_dropout"] == rate]
    expected = np.mean(np.subtract(values(0.0), values(0.1)))
    assert f"Δ = {expected:.4f} ±" in "\n".join(found.numbers), (found.numbers, expected)


@pytest.mark.slow  # ~40 s: 8 runs in 2 ensembles
def test_quick_sweep_trains_and_reports_its_claims(tmp_path):
    final = {}
    for config, summary in swept_runs(f"{SPEC}:quick", tmp_path):
        assert summary["status"] == "completed", config["train"]
        final[(config["policy"], config["model"]["attention_dropout"], config["train"]["lr"],
               config["train"]["seed"])] = summary["final_val_bpb"]
    assert set(final) == {(p["policy"], p["model.attention_dropout"], p["train.lr"],
                           p["train.seed"]) for p in stability_dropout.sweep("quick")}
    # The dropout reached training: the same policy, LR and seed end elsewhere with it.
    assert all(final[(policy, 0.1, lr, seed)] != final[(policy, 0.0, lr, seed)]
               for policy, _, lr, seed in final)
    claims_md = (tmp_path / "report" / "claims.md").read_text()
    for claim in stability_dropout.claims("quick"):
        assert claim.text in claims_md
