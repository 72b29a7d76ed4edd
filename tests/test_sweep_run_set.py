"""The run set never shrinks silently (issue 50, path 8): a sweep rerun without the
`--add_policies` it was started with is refused in one line before anything is written;
`--refine` on settings with one learning rate says it cannot refine them; `launch/local.sh`
reports only after a sweep that exited 0. The sweeps run the real command with the in-process
runner replaced by one that writes each run's files at once (as tests/test_refine.py does)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from helpers import REPO, experiment_source, snapshot

RUNNER = '''
"""A stand-in for the in-process runner: each point's files, written at once."""
import math, os
from scale_ablation.records.run_files import RunFiles


def run_in_process(sweep_dir, todo, progress, outcomes=None, **kwargs):
    for point in todo:
        config = point.config
        files = RunFiles(os.path.join(sweep_dir, point.name))
        files.write_config(config.to_dict())
        bpb = 3.0 + 0.1 * config.train.seed + (0.2 if config.policy != "inv_sqrt_dk" else 0.0)
        for step, value in ((0, 8.0), (config.train.steps, bpb)):
            files.append_metrics(step, {"val/loss": value * math.log(2), "val/bpb": value})
        files.write_summary({"status": "completed", "steps_completed": config.train.steps,
                             "final_val_bpb": bpb, "final_val_loss": bpb * math.log(2)})
        if outcomes is not None:
            outcomes[point.name] = "completed"
    return True
'''

DRIVER = """
import os
import sys
sys.path.insert(0, sys.argv.pop(1))
sys.path.insert(1, os.getcwd())  # the repository, as `python -m` from it puts it: `experiments`
import fake_runner
from absl import app
from scale_ablation import sweep
sweep.run_in_process = fake_runner.run_in_process
app.run(lambda argv: sys.exit(sweep.main(argv)))
"""

GRID = [{"policy": "inv_sqrt_dk", "train.seed": s} for s in (0, 1)]  # one LR per setting


@pytest.fixture
def files(tmp_path) -> pathlib.Path:
    (tmp_path / "fake_runner.py").write_text(RUNNER)
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "experiment.py").write_text(experiment_source(
        "One LR per setting, for tests/test_sweep_run_set.py.",
        {"train.steps": 20, "wandb.mode": "disabled"}, repr(GRID)))
    return tmp_path


def sweep(root: pathlib.Path, sweep_dir: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "driver.py"), str(root),
         f"--config={root / 'experiment.py'}", f"--workdir={sweep_dir}", *flags],
        cwd=REPO, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True, text=True,
        timeout=300)


def test_a_rerun_without_its_add_policies_is_refused_before_anything_is_written(files):
    sweep_dir = files / "sweep"
    first = sweep(files, sweep_dir, "--add_policies=inv_dk", "--noreport")
    assert first.returncode == 0, first.stdout + first.stderr
    recorded = json.loads((sweep_dir / "sweep.json").read_text())
    assert recorded["add_policies"] == ["inv_dk"] and len(recorded["runs"]) == 2 * len(GRID)
    before = snapshot(sweep_dir)
    again = sweep(files, sweep_dir, "--noreport")
    assert again.returncode == 2, again.stdout + again.stderr
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--add_policies=inv_dk" in lines[0], again.stderr
    assert snapshot(sweep_dir) == before
    # With the flag it was started with, the rerun has nothing left to run.
    assert sweep(files, sweep_dir, "--add_policies=inv_dk", "--noreport").returncode == 0


def test_refine_says_it_cannot_refine_a_setting_with_one_lr(files):
    result = sweep(files, files / "sweep", "--refine")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every setting is interior" not in result.stdout
    assert "cannot refine" in result.stdout and "one learning rate (0.003)" in result.stdout, \
        result.stdout
    assert not (files / "sweep" / "refined.json").exists()


# --------------------------------------------------------------------------- launch/local.sh

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "{calls}"
case "$*" in
  *scale_ablation.sweep*) echo "[sweep] its own last line"; exit "${{SWEEP_EXIT:-0}}" ;;
esac
exit 0
"""


@pytest.mark.parametrize("code", [0, 3, 4])
def test_local_reports_only_after_a_sweep_that_exited_0(tmp_path, code):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    (venv / "bin" / "python").write_text(FAKE_PYTHON.format(calls=calls))
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".scale_ablation-installed").touch()  # newer than pyproject.toml: no install
    env = {**os.environ, "VENV": str(venv), "SWEEP_EXIT": str(code)}
    result = subprocess.run(["bash", str(REPO / "launch" / "local.sh"),
                             "experiments/base.py:quick", str(tmp_path / "runs")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stdout + result.stderr
    reported = any("scale_ablation.report" in line for line in calls.read_text().splitlines())
    assert reported == (code == 0), calls.read_text()
    if code:
        assert len(result.stderr.strip().splitlines()) == 1
        assert f"the sweep exited {code}" in result.stderr
