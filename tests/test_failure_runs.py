"""The failure taxonomy on runs trained for real (issue 27's done-when): the quick run at LR
0.316, which ends at the unigram level, is labelled `not_learning`, not plainly "completed";
a scale-1 run at a large d_k, whose attention goes one-hot, is `entropy_collapsed` where the
same run at 1/√d_k is not. Each label is read from the run's summary and again from the
report's row; the premises are checked on the run's own numbers (its final bits per byte
against the count baselines, its logged per-head entropies against the threshold)."""

from __future__ import annotations

import math
import re

import pytest
from helpers import QUICK

from scale_ablation import report
from scale_ablation.analysis import baselines, failures
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import train

HEAD_ENTROPY = re.compile(r"attn/layer\d+/head\d+/entropy_normalised")


def report_row(workdir) -> dict:
    files = RunFiles(workdir)
    return report.summarise_run({"name": "run", "overrides": {}, "config": files.read_config(),
                                 "summary": files.read_summary(),
                                 "metrics": files.read_result_metrics()})


def test_the_quick_run_at_lr_0_316_is_labelled_not_learning(tmp_path):
    config = experiment.apply_overrides(experiment.load_config(QUICK),
                                        {"train.lr": 0.316, "wandb.mode": "disabled"})
    summary = train.train(config, tmp_path / "run")
    counts = baselines.baselines(config.to_dict())
    assert summary["status"] == "completed"
    assert summary["final_val_bpb"] >= counts["bigram_bpb"]  # the premise, from the run itself
    assert "not_learning" in summary["failures"]
    assert "not_learning" in report_row(tmp_path / "run")["failures"].split(";")


def entropy_run(tmp_path, policy: str) -> tuple[dict, list[float]]:
    """One head of d_k 1024 in the quick model, 20 steps; its per-head entropies after warmup.
    (At scale 1 its normalised entropy starts near 0.065 and falls below 0.05 by step 10.)"""
    config = experiment.apply_overrides(experiment.load_config(QUICK), {
        "policy": policy, "model.num_heads": 1, "model.head_dim": 1024, "train.steps": 20,
        "train.warmup_steps": 5, "train.log_every": 5, "train.eval_every": 10,
        "train.diag_every": 10, "checkpoint.every": 10, "wandb.mode": "disabled"})
    workdir = tmp_path / policy
    summary = train.train(config, workdir)
    entropies = [v for row in RunFiles(workdir).read_metrics() if row["step"] > 5
                 for k, v in row.items() if HEAD_ENTROPY.fullmatch(k)]
    assert summary["status"] == "completed" and entropies
    return summary, entropies


@pytest.mark.slow  # two runs of a 1024-wide head: ~40 s on 2 cores
def test_a_scale_1_run_at_d_k_1024_is_labelled_entropy_collapsed(tmp_path):
    summary, entropies = entropy_run(tmp_path, "none")
    assert min(entropies) < failures.ENTROPY_COLLAPSE  # its attention went one-hot
    assert "entropy_collapsed" in summary["failures"]
    assert summary["entropy_collapse_step"] is not None
    assert "entropy_collapsed" in report_row(tmp_path / "none")["failures"].split(";")
    # The same run with the divisor: logits 32 times smaller, attention spread out.
    control, spread = entropy_run(tmp_path, "inv_sqrt_dk")
    assert min(spread) > failures.ENTROPY_COLLAPSE and math.isfinite(min(spread))
    assert "entropy_collapsed" not in control["failures"]
