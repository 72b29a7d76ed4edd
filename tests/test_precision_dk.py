"""The float16-overflow-against-d_k study (experiments/precision_dk.py, issue 54): its grid is
the design its docstring states, its claims decide known divergence counts, and its quick sweep
trains and reports end to end."""

from __future__ import annotations

import itertools

import pytest
import test_experiments
from helpers import REPO, swept_runs

from experiments import precision, precision_dk
from scale_ablation.analysis import verdicts
from scale_ablation.training import ensemble
from scale_ablation.training import experiment_files as experiment

SPEC = str(REPO / "experiments" / "precision_dk.py")


def configs(variant: str) -> list:
    base = experiment.load_config(f"{SPEC}:{variant}")
    return [experiment.apply_overrides(base, point) for point in precision_dk.sweep(variant)]


def test_the_cpu_grid_is_the_design():
    points = precision_dk.sweep("cpu")
    _, _, qk_dims, lrs, seeds, _ = precision_dk.SIZES["cpu"]
    cells = [(p["model.qk_dim"], p["model.logits_dtype"], p["policy"], p["train.lr"],
              p["train.seed"]) for p in points]
    assert sorted(cells) == sorted(itertools.product(
        qk_dims, ("activation", "float32"), ("none", "inv_sqrt_dk"), lrs, seeds))
    assert qk_dims == (16, 32, 64, 128, 256) and len(seeds) == 3
    # precision_cpu's healthy LR and its largest, where every float16-logit run diverged.
    assert min(lrs) == precision.CPU_LRS[0] and max(lrs) == precision.LARGE_LRS[-1]
    built = configs("cpu")
    # d_k alone moves: one width, head count and value width; float16 as practised everywhere.
    assert len({(c.model.d_model, c.model.num_heads, c.model.head_dim) for c in built}) == 1
    assert {(c.train.dtype, c.model.residual_dtype, c.train.loss_scale_period,
             c.model.attention_impl) for c in built} == {
        ("float16", "float32", precision.LOSS_SCALE_PERIOD, "reference")}
    test_experiments.test_grid_resolves_to_valid_runs(REPO / "experiments" / "precision_dk.py",
                                                      "cpu")


def test_a_d_k_and_logits_dtype_is_one_ensemble(tmp_path):
    """Both scale policies, every LR and seed of one (d_k, logits dtype) share a program: the
    ensembles the sweep forms are the docstring's (quick: 4 of 4; cpu: 10 of 18, by the part
    of the config members must share)."""
    quick = configs("quick")
    groups = ensemble.group(quick, [tmp_path / str(i) for i in range(len(quick))])
    assert sorted(len(g) for g in groups) == [4] * 4
    for members in groups:
        assert len({(quick[i].model.qk_dim, quick[i].model.logits_dtype) for i in members}) == 1
    shared = [ensemble.shared_config(c) for c in configs("cpu")]
    assert sorted(shared.count(key) for key in set(shared)) == [18] * 10


def rows(diverges) -> list[dict]:
    """A row per cpu grid point: `diverges(logits, d_k, lr)` says which diverge; the rest
    complete, the healthy LR's well below the bigram line."""
    out = []
    for point in precision_dk.sweep("cpu"):
        d_k, lr, logits = point["model.qk_dim"], point["train.lr"], point["model.logits_dtype"]
        diverged = diverges(logits, d_k, lr)
        bpb = 2.75 if lr < 1e-2 else 3.7
        out.append({"policy": point["policy"], "d_k": d_k, "lr": lr, "seed": point["train.seed"],
                    "status": "diverged" if diverged else "completed",
                    "failures": "diverged" if diverged else "",
                    **{f"override:{k}": v for k, v in point.items()},
                    "final_val_bpb": None if diverged else bpb, "baseline_bigram_bpb": 3.59})
    return out


def judged(diverges) -> dict[str, verdicts.Verdict]:
    declared = precision_dk.claims("cpu")
    found = verdicts.judge_family(declared, rows(diverges))
    return {c.text: v for c, v in zip(declared, found, strict=True)}


def by_d_k(found: dict) -> dict[int, verdicts.Verdict]:
    return {d_k: next(v for text, v in found.items() if text.startswith(f"At d_k {d_k},"))
            for d_k in precision_dk.SIZES["cpu"][2]}


def growth(found: dict) -> list[str]:
    return [v.verdict for text, v in found.items() if text.startswith("The overflow grows")]


def test_the_claims_decide_an_overflow_that_grows_with_d_k():
    """float16 logits diverge at 6.81e-2 at every d_k and from 3.48e-2 at d_k >= 128; float32
    never: every d_k's claim is supported (6 of 6 against 0 of 6 survives Holm over the
    family), at the LRs where it diverged, and every growth claim is: the trend (6 of 12 at
    d_k 16-64, 12 of 12 at 128 and 256) and both ends."""
    found = judged(lambda logits, d_k, lr: logits == "activation"
                   and lr >= (3.48e-2 if d_k >= 128 else 6.81e-2))
    claims_by_d_k = by_d_k(found)
    assert {v.verdict for v in claims_by_d_k.values()} == {"supported"}
    assert claims_by_d_k[256].reason == "more divergences at LR 0.0348, 0.0681"
    assert claims_by_d_k[16].reason == "more divergences at LR 0.0681"
    assert ("activation, d_k=256, lr=0.0348: 6 of 6 diverged against float32 0 of 6"
            in "\n".join(claims_by_d_k[256].numbers))
    assert growth(found) == ["supported", "supported", "supported"]


def test_the_claims_contradict_an_overflow_that_does_not_grow():
    """The same count at every d_k (6.81e-2 only): the largest d_k has an LR >= 3.48e-2 with no
    divergence, so the growth claim on it is contradicted and the trend unresolved (6 of 12 at
    every d_k); no divergence at all contradicts every d_k's claim and leaves no trend."""
    flat = judged(lambda logits, d_k, lr: logits == "activation" and lr >= 6.81e-2)
    assert {v.verdict for v in by_d_k(flat).values()} == {"supported"}
    assert growth(flat) == ["inconclusive", "contradicted", "supported"]
    none = judged(lambda *_: False)
    assert {v.verdict for v in by_d_k(none).values()} == {"contradicted"}
    assert growth(none) == ["inconclusive", "contradicted", "supported"]
    # Both arms diverge alike: nothing for float32 logits to cure.
    both = judged(lambda logits, d_k, lr: lr >= 6.81e-2)
    assert {v.verdict for v in by_d_k(both).values()} == {"inconclusive"}


@pytest.mark.slow  # ~1 min: 16 runs in 4 ensembles
def test_quick_sweep_trains_and_reports_its_claims(tmp_path):
    runs = swept_runs(f"{SPEC}:quick", tmp_path)
    assert len(runs) == len(precision_dk.sweep("quick"))
    seen = set()
    for config, summary in runs:
        assert summary["status"] in ("completed", "diverged"), config["train"]
        assert (config["train"]["dtype"], config["model"]["residual_dtype"]) == (
            "float16", "float32")
        seen.add((config["model"]["qk_dim"], config["model"]["logits_dtype"]))
    assert seen == set(itertools.product((16, 256), ("activation", "float32")))
    claims_md = (tmp_path / "report" / "claims.md").read_text()
    for claim in precision_dk.claims("quick"):
        assert claim.text in claims_md
    for d_k in (16, 256):  # each d_k's counts, float16 logits against float32 ones
        assert f"activation, d_k={d_k}, lr=0.0681: " in claims_md
