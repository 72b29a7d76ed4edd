"""The learned scale over training and float16's maximum on max-logit plots, drawn from
synthetic run files; the drawn values checked against numpy means computed here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.figure import Figure

from experiments import base
from scale_ablation import report
from scale_ablation.analysis import plot_style
from scale_ablation.analysis import plots as report_plots
from scale_ablation.analysis import tables as report_tables

STEPS = (0, 25, 50)
SEEDS = (0, 1, 2)


def scale_at(policy: str, seed: int, layer: int, step: int) -> float:
    start = 1.0 if policy == "learned:1.0" else 0.25
    return start * (0.9 + 0.01 * seed + 0.02 * layer) ** (step / 25)


def synthetic_run(policy: str, seed: int, d_k: int = 16) -> dict:
    config = base.get_config("quick").to_dict()
    config["policy"] = policy
    config["model"]["head_dim"] = d_k
    config["train"]["seed"] = seed
    metrics = [{"step": step, "attn/layer0/entropy": 1.0, "attn/layer1/entropy": 1.0,
                **{f"attn/layer{i}/learned_scale": scale_at(policy, seed, i, step)
                   for i in (0, 1)}}
               for step in STEPS]
    if policy == "inv_sqrt_dk":  # a fixed scale logs none
        metrics = [{k: v for k, v in r.items() if "learned" not in k} for r in metrics]
    return {"name": f"{policy},{seed}", "overrides": {"policy": policy, "train.seed": seed},
            "config": config, "metrics": metrics,
            "summary": {"status": "completed", "final_val_bpb": 3.0, "final_val_loss": 2.0}}


def test_learned_scale_over_training_is_the_mean_over_seeds_and_layers():
    runs = [synthetic_run(p, s) for p in ("inv_sqrt_dk", "learned", "learned:1.0") for s in SEEDS]
    rows = [report.summarise_run(run) for run in runs]
    fig = report_plots.plot_learned_scale_over_training(runs, rows)
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    lines = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
    for policy in ("learned", "learned:1.0"):
        expected = [np.mean([[scale_at(policy, s, i, step) for i in (0, 1)] for s in SEEDS])
                    for step in STEPS]
        np.testing.assert_allclose(lines[f"{policy}||16"].get_ydata(), expected, rtol=1e-12)
        np.testing.assert_array_equal(lines[f"{policy}||16"].get_xdata(), STEPS)
    assert not any(gid.startswith("inv_sqrt_dk") for gid in lines)  # no learned scale, no line
    (reference,) = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert list(reference.get_ydata()) == [1 / math.sqrt(16)] * 2


def test_no_learned_scale_no_plot(tmp_path):
    runs = [synthetic_run("inv_sqrt_dk", s) for s in SEEDS]
    rows = [report.summarise_run(run) for run in runs]
    assert report_plots.plot_learned_scale_over_training(runs, rows) is None
    assert "learned_scale_over_training.png" not in report_plots.write_plots(runs, rows,
                                                                             str(tmp_path))
    assert not (tmp_path / "learned_scale_over_training.png").exists()


@pytest.mark.parametrize("dtype,drawn", [("float16", True), ("bfloat16", False), (None, False)])
def test_float16_maximum_marked_when_the_sweep_has_float16_runs(dtype, drawn):
    rows = [{"override:train.dtype": "float32"}, {} if dtype is None else
            {"override:train.dtype": dtype}]
    ax = Figure().subplots()
    plot_style.float16_max(ax, rows, plot_style.Keys(plot_style.Style.of([])))
    levels = [line.get_ydata()[0] for line in ax.get_lines()]
    assert levels == ([float(np.finfo(np.float16).max)] if drawn else [])


def test_max_logit_against_lr_carries_the_float16_line():
    rows = [{"policy": "none", "d_k": 32, "lr": lr, "seed": s, "status": "completed",
             "override:train.dtype": "float16", "override:train.lr": lr,
             "max_attention_logit/layer0": 10.0 ** (3 + lr + 0.1 * s)}
            for lr in (0.01, 0.3) for s in SEEDS]
    fig = report_plots.plot_against_lr(rows, "max_attention_logit/layer0", "max", unit=None,
                                       log_y=True, float16_line=True)
    assert any(list(line.get_ydata()) == [65504.0] * 2 for line in fig.axes[0].get_lines())


def test_summary_tables_the_final_learned_scale_of_each_policy(tmp_path):
    """summary.md carries the final learned scale (mean over layers, then over seeds, as numpy
    computes it here) of the learned policies; the fixed one has no row."""
    runs = [synthetic_run(p, s) for p in ("inv_sqrt_dk", "learned", "learned:1.0") for s in SEEDS]
    rows = [report.summarise_run(run) for run in runs]
    path = tmp_path / "summary.md"
    report_tables.write_markdown(rows, str(path))
    text = path.read_text()
    table = text[text.index("# Final learned scale"):].split("\n\n")[1].splitlines()
    cells = {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1] for line in table[2:]}
    for policy in ("learned", "learned:1.0"):
        finals = [np.mean([scale_at(policy, s, i, STEPS[-1]) for i in (0, 1)]) for s in SEEDS]
        assert cells[policy].startswith(f"{np.mean(finals):.4f} ± "), cells
    assert set(cells) == {"learned", "learned:1.0"}


def test_a_policy_that_diverged_at_every_d_k_is_only_its_marks():
    rows = [{"name": f"{policy},{d_k},{seed}", "policy": policy, "d_k": d_k, "lr": 1e-3,
             "seed": seed, "status": "diverged" if policy == "none" else "completed",
             "final_val_bpb": None if policy == "none" else 3.0 + d_k / 1000 + seed / 100}
            for policy in ("inv_sqrt_dk", "none") for d_k in (16, 32, 64) for seed in (0, 1)]
    fig = report_plots.plot_final_vs_dk(rows)
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    drawn = {line.get_marker(): [int(x) for x in line.get_xdata()] for line in ax.lines
             if line.get_marker() in ("o", "x")}
    assert drawn == {"o": [16, 32, 64], "x": [16, 32, 64]}  # 1/√d_k's line; none's marks only
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "inv_sqrt_dk", "x (top edge): diverged"]
