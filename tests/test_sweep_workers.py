"""`sweep --workers=P` (issue 56): pinned processes that each train a share of the sweep's groups
as ensembles. Against the default in-process runner on the same grid: the same runs, each ending
with the same losses (the same seeds; float tolerance: one pinned core against two threads), every
group trained by one worker, and the shares balanced by FLOPs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from helpers import REPO, TINY_RUN, experiment_source

from scale_ablation.sweeping import planner, sweep_grid, workers
from scale_ablation.training import experiment_files as experiment

# Two groups (two model widths: two programs), two seeds and two LRs each: 8 runs.
GRID = [{"model.d_model": d, "model.head_dim": d // 2, "train.lr": lr, "train.seed": s}
        for d in (32, 64) for lr in (1e-3, 3e-3) for s in (0, 1)]
ENV = {**os.environ, "WANDB_MODE": "disabled"}
# Given to the workers (`--process_xla_flags`); XLA's default value, so their runs' numbers stay
# those of the in-process runs they are compared with.
BENIGN_XLA_FLAG = "--xla_cpu_enable_fast_math=false"


def sweep(spec: pathlib.Path, sweep_dir: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scale_ablation.sweep", f"--config={spec}",
                           f"--workdir={sweep_dir}", "--noreport", *flags], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=600)


def finals(sweep_dir: pathlib.Path) -> dict[str, tuple[str, float, list[str]]]:
    """Run name -> (status, final validation loss, the XLA flags it ran under)."""
    out = {}
    for path in sweep_dir.glob("*/summary.json"):
        summary = json.loads(path.read_text())
        out[path.parent.name] = (summary["status"], summary["final_val_loss"],
                                 summary["environment"]["xla_flags"].split())
    return out


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("workers") / "grid.py"
    path.write_text(experiment_source("Two groups for tests/test_sweep_workers.py.", TINY_RUN,
                                      repr(GRID)))
    return path


def test_shares_are_whole_groups_balanced_by_flops(spec):
    points = sweep_grid.expand(f"{spec}", str(spec.parent / "unused"))
    parts = workers.shares(points, 2)
    keys = [{planner.program_key(p.config) for p in part} for part in parts]
    assert len(parts) == 2 and all(len(k) == 1 for k in keys) and keys[0] != keys[1]
    assert sorted(p.name for part in parts for p in part) == sorted(p.name for p in points)
    assert [len(part) for part in workers.shares(points, 3)] == [4, 4]  # no empty share
    # A third group, deeper narrow runs: the wide group (the heaviest) gets a share of its own
    # and the two narrow ones share the other (dealt in order, it would be wide + deep).
    deep = [sweep_grid.Point(f"deep{p.name}", {}, experiment.apply_overrides(
        p.config, {"model.num_layers": 2})) for p in points[:2]]
    parts = workers.shares([*points, *deep], 2)
    widths = [sorted({(p.config.model.d_model, p.config.model.num_layers) for p in part})
              for part in parts]
    assert sorted(widths) == [[(32, 1), (32, 2)], [(64, 1)]]


@pytest.mark.slow  # two sweeps of 8 tiny runs in subprocesses, ~40 s
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins two workers to a core each")
def test_workers_train_every_run_as_the_default_runner_does(spec, tmp_path):
    alone, pinned = tmp_path / "in_process", tmp_path / "workers"
    first = sweep(spec, alone, "--max_members=0")
    assert first.returncode == 0, first.stdout + first.stderr
    second = sweep(spec, pinned, "--workers=2", "--threads_per_process=1", "--max_members=4",
                   f"--process_xla_flags={BENIGN_XLA_FLAG}")
    assert second.returncode == 0, second.stdout + second.stderr
    expected, found = finals(alone), finals(pinned)
    assert len(found) == len(GRID) and set(found) == set(expected)
    for name, (status, loss, xla_flags) in found.items():
        assert status == "completed" == expected[name][0], name
        assert loss == pytest.approx(expected[name][1], rel=1e-4), name
        assert BENIGN_XLA_FLAG in xla_flags and BENIGN_XLA_FLAG not in expected[name][2], name
    assert "[sweep] 2 workers, 1 core(s) each; their progress: worker_0.log (4 runs), " \
        "worker_1.log (4 runs)" in second.stdout
    logs = sorted(p.name for p in pinned.glob("worker_*.log"))
    assert logs == ["worker_0.log", "worker_1.log"]
    assert not list(pinned.glob(".worker_*"))  # the share files are gone
    record = json.loads((pinned / "sweep.json").read_text())
    assert {r["status"] for r in record["runs"]} == {"completed"}
