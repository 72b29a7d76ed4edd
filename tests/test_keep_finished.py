"""A finished run keeps only its final checkpoint unless `checkpoint.keep_finished` (issue 56).

Each case counts the step directories on disk itself, before and after, and holds the pruned run
against the same run with every checkpoint kept: the same files besides the older checkpoints,
the same final state bit for bit, the same --extend from it, and a rerun that changes nothing.
An interrupted run keeps what it needs to resume; a diverged one keeps the step `nonfinite`
replays from.
"""

from __future__ import annotations

import pathlib
import shutil

import jax
import numpy as np
import pytest
from helpers import snapshot, tiny_config

from scale_ablation.records.checkpoints import Checkpoints
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import hooks, run_setup, train

# Differ between any two runs; `ensemble` names the run directory (different here by design).
NOT_COMPARED = ("wall_seconds", "tokens_per_second", "environment", "ensemble")
KEEP = {"checkpoint.keep_finished": True}


def steps_on_disk(workdir: pathlib.Path) -> list[int]:
    """The saved steps, by the directory names alone (not through the code under test)."""
    directory = workdir / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def files_outside_checkpoints(workdir: pathlib.Path) -> set[str]:
    return {str(p.relative_to(workdir)) for p in workdir.rglob("*")
            if p.is_file() and "checkpoints" not in p.relative_to(workdir).parts}


def state_bytes(workdir: pathlib.Path, config, step: int) -> list[bytes]:
    _, like = run_setup.init_state(config)
    checkpoints = Checkpoints(workdir)
    try:
        return [np.asarray(leaf).tobytes()
                for leaf in jax.tree.leaves(checkpoints.restore(step, like))]
    finally:
        checkpoints.close()


def results(workdir: pathlib.Path) -> tuple[dict, list[dict]]:
    """summary.json without timings, and the metrics rows without perf/*."""
    summary = RunFiles(workdir).read_summary()
    rows = [{k: v for k, v in row.items() if not k.startswith("perf/")}
            for row in RunFiles(workdir).read_metrics()]
    return {k: v for k, v in summary.items() if k not in NOT_COMPARED}, rows


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The tiny run (10 steps, checkpoints at 5 and 10, keep 2) trained twice: with the
    default and with keep_finished."""
    root = tmp_path_factory.mktemp("keep_finished")
    runs = {"dropped": tiny_config(), "kept": tiny_config(**KEEP)}
    for name, config in runs.items():
        assert train.train(config, root / name)["status"] == "completed"
    return {name: root / name for name in runs}


def test_a_completed_run_keeps_its_final_checkpoint_and_every_other_file(pair):
    assert steps_on_disk(pair["kept"]) == [5, 10]
    assert steps_on_disk(pair["dropped"]) == [10]
    assert files_outside_checkpoints(pair["dropped"]) == files_outside_checkpoints(pair["kept"])
    assert results(pair["dropped"]) == results(pair["kept"])
    config = tiny_config()
    assert state_bytes(pair["dropped"], config, 10) == state_bytes(pair["kept"], config, 10)


def test_rerunning_a_pruned_finished_run_changes_nothing(pair):
    before = snapshot(pair["dropped"])
    summary = train.train(tiny_config(), pair["dropped"])
    assert summary["status"] == "completed"
    assert snapshot(pair["dropped"]) == before


def test_extending_a_pruned_run_is_the_extension_of_the_kept_one(pair, tmp_path):
    """--extend resumes from the newest checkpoint, which pruning keeps: the same rows and
    final state, bit for bit, as from the run that kept every checkpoint."""
    extended = {}
    for name, extra in (("dropped", {}), ("kept", KEEP)):
        workdir = tmp_path / name
        shutil.copytree(pair[name], workdir)
        config = tiny_config(**{"train.steps": 15, **extra})
        assert train.train(config, workdir, extend=True)["status"] == "completed"
        extended[name] = workdir
    assert steps_on_disk(extended["dropped"]) == [15]
    assert steps_on_disk(extended["kept"]) == [10, 15]
    assert results(extended["dropped"]) == results(extended["kept"])
    config = tiny_config(**{"train.steps": 15})
    assert (state_bytes(extended["dropped"], config, 15)
            == state_bytes(extended["kept"], config, 15))


def test_an_interrupted_run_keeps_its_checkpoints(tmp_path):
    summary = train.train(tiny_config(), tmp_path / "run", extra_hooks=[hooks.signal_at("7")])
    assert (summary["status"], summary["steps_completed"]) == ("preempted", 7)
    assert steps_on_disk(tmp_path / "run") == [5, 7]


def test_a_diverged_run_keeps_the_step_before_its_divergence(tmp_path):
    """lr 1e4 without clipping or warmup diverges at step 4 (tests/test_nonfinite.py); with
    checkpoints every 2 steps the run saved step 2, then its last good step, 3."""
    diverging = {"train.lr": 1e4, "train.grad_clip": 0.0, "train.warmup_steps": 0,
                 "train.log_every": 1, "checkpoint.every": 2}
    got = {}
    for name, extra in (("dropped", {}), ("kept", KEEP)):
        summary = train.train(tiny_config(**diverging, **extra), tmp_path / name)
        assert summary["status"] == "diverged"
        got[name] = summary["diverged_at_step"]
    at = got["dropped"]
    assert at == got["kept"] and at > 3
    assert steps_on_disk(tmp_path / "kept")[-2:] == [at - 2, at - 1]
    assert steps_on_disk(tmp_path / "dropped") == [at - 1]
    config = tiny_config(**diverging)
    assert (state_bytes(tmp_path / "dropped", config, at - 1)
            == state_bytes(tmp_path / "kept", config, at - 1))


def test_each_member_of_an_ensemble_keeps_its_own_final_checkpoint(tmp_path):
    configs = [tiny_config(**{"train.seed": seed}) for seed in (0, 1)]
    workdirs = [tmp_path / f"seed{seed}" for seed in (0, 1)]
    summaries = train.train_runs(configs, workdirs)
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert [steps_on_disk(w) for w in workdirs] == [[10], [10]]


# --------------------------------------------------------------------------- keep_final off

NONE_KEPT = {"checkpoint.keep_final": False}


def test_a_smoke_run_keeps_no_checkpoint_and_the_same_results(pair, tmp_path):
    """checkpoint.keep_final off (quick sweeps): the run's files and numbers are the pruned
    run's, its checkpoints gone; a rerun returns its summary and trains nothing."""
    workdir = tmp_path / "none"
    assert train.train(tiny_config(**NONE_KEPT), workdir)["status"] == "completed"
    assert not (workdir / "checkpoints").exists()
    assert files_outside_checkpoints(workdir) == files_outside_checkpoints(pair["dropped"])
    assert results(workdir) == results(pair["dropped"])
    before = snapshot(workdir)
    assert train.train(tiny_config(**NONE_KEPT), workdir)["status"] == "completed"
    assert snapshot(workdir) == before


def test_extending_a_run_without_a_checkpoint_is_refused_before_anything_changes(tmp_path):
    """Trained anew on the longer schedule it would replace its history: one line, no change."""
    workdir = tmp_path / "none"
    assert train.train(tiny_config(**NONE_KEPT), workdir)["status"] == "completed"
    before = snapshot(workdir)
    with pytest.raises(run_setup.ConfigError, match="finished without a checkpoint"):
        train.train(tiny_config(**{"train.steps": 15, **NONE_KEPT}), workdir, extend=True)
    assert snapshot(workdir) == before


def test_each_member_of_a_smoke_ensemble_keeps_no_checkpoint(tmp_path):
    configs = [tiny_config(**{"train.seed": seed, **NONE_KEPT}) for seed in (0, 1)]
    workdirs = [tmp_path / f"seed{seed}" for seed in (0, 1)]
    summaries = train.train_runs(configs, workdirs)
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert not any((w / "checkpoints").exists() for w in workdirs)


def test_a_diverged_smoke_run_keeps_the_step_nonfinite_replays(tmp_path):
    """keep_final off removes a completed run's checkpoints, not the one a divergence needs."""
    diverging = {"train.lr": 1e4, "train.grad_clip": 0.0, "train.warmup_steps": 0,
                 "train.log_every": 1, "checkpoint.every": 2}
    summary = train.train(tiny_config(**diverging, **NONE_KEPT), tmp_path / "run")
    assert summary["status"] == "diverged"
    assert steps_on_disk(tmp_path / "run") == [summary["diverged_at_step"] - 1]
