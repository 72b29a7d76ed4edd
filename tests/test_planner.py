"""The planner (`--plan`, `--budget_hours`), the accelerator studies' plans and the device check.

The plans are checked, not run: every accelerator variant gives each compared setting at least
three seeds and at least three learning rates with the setting's best LR from the CPU studies
(the README's results, written out here) strictly inside, and plans the device-hours its
docstring states, within 25%.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from scale_ablation import sweep
from scale_ablation.model.build import build_model
from scale_ablation.sweeping import planner
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training.run_config import validate

REPO = pathlib.Path(__file__).resolve().parents[1]
STUDIES = ("dk_sweep", "lr_sensitivity", "learned_scale", "init_gain", "norm_placement",
           "stability", "precision", "length_generalization", "mqar")
# Best LRs the CPU studies located (README, Results), per policy, or for a setting that moved
# them: post-norm blocks, q/k init gain 4 (the policy's own bests do not apply there).
CPU_BEST = {"inv_sqrt_dk": (3e-3, 4.64e-3), "none": (1e-3, 3e-3), "inv_dk": (3e-3, 1e-2),
            "qk_layernorm": (1.78e-2,), "log_length": (1e-2,), "post": (1e-2,),
            "gain 4": (1e-2, 3e-2)}


def cpu_bests(setting: dict, policy: str) -> tuple[float, ...]:
    if setting.get("model.init_gain") == 4.0 and policy != "none":
        return CPU_BEST["gain 4"]
    if setting.get("model.norm_position") == "post":
        return CPU_BEST["post"]
    return CPU_BEST.get(policy, ())
ENV = {**os.environ, "WANDB_MODE": "disabled", "JAX_PLATFORMS": "cpu"}


def sweep_command(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scale_ablation.sweep", "--config=experiments/base.py:quick",
         f"--workdir={tmp_path / 'sweep'}", "--device=cpu", *flags],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)


def test_plan_prints_the_costs_and_writes_nothing(tmp_path):
    done = sweep_command(tmp_path, "--plan")
    assert done.returncode == 0, done.stderr
    for words in ("1 runs", "parameters", "tokens a run", "passes", "train FLOPs",
                  "GiB a run", "device-hours on cpu", "rate:"):
        assert words in done.stdout, (words, done.stdout)
    assert not (tmp_path / "sweep").exists()


def test_a_plan_over_budget_is_refused_in_one_line(tmp_path):
    done = sweep_command(tmp_path, "--budget_hours=1e-9")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "budget_hours" in done.stderr
    assert not (tmp_path / "sweep").exists()


def test_run_cost_counts_the_built_model_and_the_tokens():
    config = experiment.load_config("experiments/base.py:quick")
    cost = planner.run_cost("quick", config)
    model = build_model(validate(config), nnx.Rngs(0))
    built = sum(int(np.prod(x.shape)) for x in
                __import__("jax").tree.leaves(nnx.state(model, nnx.Param)))
    assert cost.parameters == built
    t = config.train
    assert cost.tokens == t.steps * t.batch_size * config.data.seq_len
    # The plays' training split is what data.make_source reads.
    from scale_ablation.data import sources
    assert cost.passes == pytest.approx(
        cost.tokens / sources.make_source(config.data, seed=0).train.size)


def test_peak_memory_holds_the_state_and_grows_with_the_batch():
    config = experiment.load_config("experiments/base.py:quick")
    small = planner.shape_cost(config).peak_bytes
    parameters = planner.run_cost("quick", config).parameters
    # Parameters and Adam's two moments in float32 are arguments of the step.
    assert small >= 3 * 4 * parameters
    bigger = experiment.apply_overrides(config, {"train.batch_size": 8 * config.train.batch_size})
    assert planner.shape_cost(bigger).peak_bytes > small


def test_a_measured_table_sets_the_rate(tmp_path):
    table = {"device_kind": "NVIDIA H200", "date": "2026-12-01", "entries": [
        {"name": "a", "members": 1, "flops_per_token": 1e8, "tokens_per_s": 1e6},
        {"name": "b", "members": 8, "flops_per_token": 1e8, "tokens_per_s": 6e6}]}
    (tmp_path / "throughput_NVIDIA_H200.json").write_text(json.dumps(table))
    (tmp_path / "throughput_tiny.json").write_text(json.dumps({**table, "tiny": True}))
    found = planner.read_table("H200", str(tmp_path))
    assert found == table
    per_second, source = planner.rate(planner.device("H200"), 1.2e8, 8, found)
    assert per_second == 6e6 * 1e8 and "entry b" in source
    per_second, source = planner.rate(planner.device("H200"), 1e8, 1, None)
    assert per_second == pytest.approx(0.4 * 989e12) and "assumed 40% MFU" in source


def _setting(point: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in point.items() if k not in ("train.lr", "train.seed")))


@pytest.mark.parametrize("study", STUDIES)
def test_every_accelerator_setting_has_seeds_and_an_interior_lr(study):
    spec = str(REPO / "experiments" / f"{study}.py")
    base = experiment.load_config(spec)
    lrs, seeds = {}, {}
    for point in experiment.load_grid(spec):
        lrs.setdefault(_setting(point), set()).add(point.get("train.lr", base.train.lr))
        seeds.setdefault(_setting(point), set()).add(point.get("train.seed", base.train.seed))
    for setting, grid in lrs.items():
        assert len(grid) >= 3 and len(seeds[setting]) >= 3, (study, setting, grid)
        named = dict(setting)
        for best in cpu_bests(named, named.get("policy", base.policy)):
            if study == "precision":  # compared at each large LR, with one LR below all
                assert min(grid) <= best, (study, setting, grid)
            else:
                assert min(grid) < best < max(grid), (study, setting, sorted(grid))


@pytest.mark.parametrize("study", STUDIES)
def test_the_planned_device_hours_are_the_docstrings(study):
    spec = str(REPO / "experiments" / f"{study}.py")
    module, _ = experiment.load_module(spec)
    stated = re.search(r"Budget \(default\): ([0-9.]+) device-hours", module.__doc__)
    assert stated, f"{study}: no 'Budget (default): N device-hours' in the docstring"
    points = sweep.expand(spec, f"/nonexistent/{study}")
    plan = planner.make_plan(points, planner.device("H200"), None, memory=False)
    assert math.isclose(plan.device_hours, float(stated.group(1)), rel_tol=0.25), (
        study, plan.device_hours)


@pytest.mark.slow  # minutes on 2 cores: `-m slow`
def test_the_device_check_runs_tiny_on_a_cpu_and_writes_the_table(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--tiny",
                           f"--out_dir={tmp_path}"], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RESULT fused_agrees=True trains=True" in done.stdout
    (path,) = tmp_path.glob("throughput_*.json")
    table = json.loads(path.read_text())
    assert table["tiny"] is True and {e["members"] for e in table["entries"]} == {1, 2}
    for entry in table["entries"]:
        assert entry["tokens_per_s"] > 0 and entry["peak_bytes"] > 0
        assert entry["mfu"] == pytest.approx(
            entry["tokens_per_s"] * entry["flops_per_token"] / table["peak_flops"])
    assert [s["steps_per_call"] for s in table["sweeps"]] == [1, 8]
    assert planner.read_table(table["device_kind"], str(tmp_path)) is None  # tiny: not a rate
