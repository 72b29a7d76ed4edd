"""Ensembles (`train.train_runs`) against their members trained alone with `train.train`.

Members differ in scalar policy, seed and learning rate, with attention dropout on so that each
member's dropout keys must match its solo run's. Every check compares with runs the ensemble code
does not make: solo runs, an uninterrupted ensemble, a sweep run without ensembles.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import QUICK, REPO, TINY_MODEL, experiment_source, read_json

from scale_ablation.data import sources as data_lib
from scale_ablation.records import wandb_offline
from scale_ablation.records.checkpoints import Checkpoints
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import ensemble, hooks, optim, run_setup, steps, train
from scale_ablation.training import experiment_files as experiment

RTOL = 1e-5  # float32 round-off: a vmapped matmul may sum in another order than a solo one

# No clipping and no warmup for all: the diverging member may differ in its lr only.
TINY = {  # the shared tiny model (helpers.TINY_MODEL), longer, with dropout and diagnostics
    **TINY_MODEL, "model.attention_dropout": 0.1, "train.steps": 16, "train.warmup_steps": 0,
    "train.grad_clip": 0.0, "train.log_every": 2, "train.eval_every": 4, "train.diag_every": 8,
    "checkpoint.every": 8, "wandb.mode": "disabled",
}
MEMBERS = {
    "none": {"policy": "none", "train.seed": 0, "train.lr": 3e-3},
    "inv_sqrt_dk": {"policy": "inv_sqrt_dk", "train.seed": 1, "train.lr": 1e-2},
    "const": {"policy": "const:0.3", "train.seed": 2, "train.lr": 5e-3},
    # tests/test_sweep.py found lr 1e4 to diverge this model at step 4.
    "diverging": {"policy": "inv_sqrt_dk", "train.seed": 3, "train.lr": 1e4},
}


def config_of(*overrides: dict):
    config = experiment.load_config(QUICK)
    for layer in (TINY, *overrides):
        config = experiment.apply_overrides(config, layer)
    return config




def rows_of(workdir) -> list[dict]:
    """metrics.jsonl without timings."""
    rows = RunFiles(workdir).read_metrics()
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def final_state(workdir, config, step=None):
    _, like = run_setup.init_state(config)
    checkpoints = Checkpoints(workdir)
    try:
        return checkpoints.restore(step or checkpoints.latest_step(), like)
    finally:
        checkpoints.close()


def assert_same_numbers(got, want, rtol=RTOL):
    assert got.keys() == want.keys()
    for key in want:
        if want[key] is None or got[key] is None:
            assert got[key] == want[key], key
        else:
            assert got[key] == pytest.approx(want[key], rel=rtol, abs=1e-6), key


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The four members trained alone and as one ensemble (W&B offline for the ensemble)."""
    root = tmp_path_factory.mktemp("ensemble")
    configs = {name: config_of(overrides) for name, overrides in MEMBERS.items()}
    solo = {name: train.train(config, root / "solo" / name) for name, config in configs.items()}
    offline = [config_of(MEMBERS[name], {"wandb.mode": "offline"}) for name in configs]
    workdirs = [root / "ensemble" / name for name in configs]
    groups = ensemble.group(offline, workdirs)
    together = train.train_runs(offline, workdirs)
    return {"root": root, "configs": configs, "solo": solo, "groups": groups,
            "ensemble": dict(zip(configs, together, strict=True))}


def test_members_train_as_they_would_alone(trained):
    root, configs = trained["root"], trained["configs"]
    assert trained["groups"] == [[0, 1, 2, 3]]
    for name in ("none", "inv_sqrt_dk", "const"):
        solo_dir, member_dir = root / "solo" / name, root / "ensemble" / name
        summary, expected = trained["ensemble"][name], trained["solo"][name]
        assert summary == read_json(member_dir / "summary.json")
        assert summary.keys() == expected.keys()
        assert summary["status"] == "completed" and summary["steps_completed"] == 16
        for field in ("final_train_loss", "final_val_loss", "final_val_bpb"):
            assert summary[field] == pytest.approx(expected[field], rel=RTOL), (name, field)

        # The same rows, keys and steps (step 0 included); losses to round-off. Attention
        # statistics and norms get a looser bound: an entropy near 0 is ill-conditioned.
        rows, solo_rows = rows_of(member_dir), rows_of(solo_dir)
        assert [r["step"] for r in rows] == [r["step"] for r in solo_rows]
        assert [r["step"] for r in rows][:2] == [0, 2]
        for row, solo_row in zip(rows, solo_rows, strict=True):
            losses = {k: v for k, v in row.items() if "loss" in k or "bpb" in k}
            assert_same_numbers(losses, {k: solo_row[k] for k in losses})
            assert_same_numbers(row, solo_row, rtol=1e-3)
        assert read_json(member_dir / "config.json")["policy"] == MEMBERS[name]["policy"]

        # Each member's checkpoints are its own unstacked state, restorable like a solo run's;
        # finished, it keeps its final one (checkpoint.keep_finished), as the solo run does.
        assert os.listdir(member_dir / "checkpoints") == os.listdir(solo_dir / "checkpoints")
        assert os.listdir(member_dir / "checkpoints") == ["16"]
        got = jax.tree.leaves_with_path(final_state(member_dir, configs[name]))
        want = jax.tree.leaves_with_path(final_state(solo_dir, configs[name]))
        assert len(got) == len(want) > 10
        for (path, a), (_, b) in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-6,
                                       err_msg=jax.tree_util.keystr(path))

    # Each member is its own W&B run, with the history its metrics.jsonl holds.
    run_ids = set()
    for name, summary in trained["ensemble"].items():
        (run_dir,) = wandb_offline.find_run_dirs(root / "ensemble" / name)
        run_ids.add(summary["wandb_run_id"])
        history = {r["_step"]: r["train/loss"] for r in wandb_offline.read_history(run_dir)
                   if "train/loss" in r and r["train/loss"] == r["train/loss"]}
        logged = {r["step"]: r["train/loss"] for r in rows_of(root / "ensemble" / name)
                  if r.get("train/loss") is not None}
        assert logged and history == logged
    assert None not in run_ids and len(run_ids) == 4


def test_a_diverging_member_diverges_as_alone_and_leaves_the_others_alone(trained):
    root = trained["root"]
    summary, expected = trained["ensemble"]["diverging"], trained["solo"]["diverging"]
    assert expected["status"] == "diverged" and 1 < expected["diverged_at_step"] < 16
    assert summary["status"] == "diverged"
    for field in ("diverged_at_step", "steps_completed", "final_val_loss"):
        assert summary[field] == expected[field], field
    # The last finite loss is ~1e12 and growing fast: round-off grows with it.
    assert summary["final_train_loss"] == pytest.approx(expected["final_train_loss"], rel=1e-3)
    rows, solo_rows = rows_of(root / "ensemble" / "diverging"), rows_of(root / "solo" / "diverging")
    assert [r["step"] for r in rows] == [r["step"] for r in solo_rows]
    assert rows[-1]["step"] == summary["diverged_at_step"] and rows[-1]["train/diverged"] == 1.0
    # Both kept the last good state, the step before the divergence, as a checkpoint.
    before = expected["diverged_at_step"] - 1
    config = trained["configs"]["diverging"]
    got = final_state(root / "ensemble" / "diverging", config, before)
    want = final_state(root / "solo" / "diverging", config, before)
    assert int(got["step"]) == int(want["step"]) == before
    for a, b in zip(jax.tree.leaves(got["params"]), jax.tree.leaves(want["params"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3)
    # The other members shared its program to the end and still match their solo runs
    # (test_members_train_as_they_would_alone); here: they ran all 16 steps after it froze.
    for name in ("none", "inv_sqrt_dk", "const"):
        assert trained["ensemble"][name]["steps_completed"] == 16
        assert rows_of(root / "ensemble" / name)[-1]["step"] == 16


def test_the_ensemble_step_compiles_once(trained):
    config = trained["configs"]["none"]
    graphdef, _ = run_setup.init_state(config)
    step = steps.programs(graphdef, optim.OptimizerSettings.of(config),
                          float(config.train.z_loss)).train_program(4, donate=False)
    # 16 steps of 4 members, one of them frozen after diverging: one program (the pipelined
    # loop's, which keeps each state for the hooks of its step: no donation).
    assert step._cache_size() == 1


# --------------------------------------------------------------------------- resume

RESUME = {"train.steps": 20, "checkpoint.every": 5, "train.diag_every": 0}
RESUME_MEMBERS = [
    {"policy": "none", "train.seed": 0, "train.lr": 3e-3},
    {"policy": "inv_sqrt_dk", "train.seed": 1, "train.lr": 1e-2},
]
PREEMPT_AT = 12  # SIGTERM once this step is done (hooks.signal_at): the run stops there


def test_a_preempted_ensemble_resumes_exactly(tmp_path):
    configs = [config_of(RESUME, member) for member in RESUME_MEMBERS]
    names = ["a", "b"]
    uninterrupted = train.train_runs(configs, [tmp_path / "whole" / n for n in names])
    workdirs = [tmp_path / "resumed" / n for n in names]

    preempted = train.train_runs(configs, workdirs,
                                 extra_hooks=[hooks.signal_at(str(PREEMPT_AT))])
    for summary, workdir in zip(preempted, workdirs, strict=True):
        assert summary["status"] == "preempted" and summary["signal"] == "SIGTERM"
        assert summary["steps_completed"] == PREEMPT_AT
        assert (workdir / "checkpoints" / str(PREEMPT_AT)).is_dir()

    # Members resuming from one step train together; from different steps, apart.
    fresh = tmp_path / "fresh"
    behind = tmp_path / "behind"
    shutil.copytree(workdirs[1], behind)
    shutil.rmtree(behind / "checkpoints" / str(PREEMPT_AT))  # back to step 10
    assert ensemble.group(configs + configs, [*workdirs, fresh, behind]) == [[0, 1], [2], [3]]

    resumed = train.train_runs(configs, workdirs)
    for got, want, workdir, config in zip(resumed, uninterrupted, workdirs, configs, strict=True):
        assert got["status"] == "completed"
        for field in ("steps_completed", "final_train_loss", "final_val_loss"):
            assert got[field] == want[field], field
        rows = rows_of(workdir)
        assert rows == rows_of(tmp_path / "whole" / workdir.name)  # no step twice, none lost
        a = jax.tree.leaves(final_state(workdir, config, 20))
        b = jax.tree.leaves(final_state(tmp_path / "whole" / workdir.name, config, 20))
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    # A member's checkpoint is a solo run's: it can go on alone (to round-off of the ensemble).
    alone = train.train(configs[1], behind)
    assert alone["status"] == "completed" and alone["steps_completed"] == 20
    for field in ("final_train_loss", "final_val_loss"):
        assert alone[field] == pytest.approx(uninterrupted[1][field], rel=RTOL), field


# --------------------------------------------------------------------------- the sweep

EXPERIMENT = experiment_source(
    "Two scalar policies x two seeds of a tiny model, for tests/test_ensemble.py.",
    {**TINY, "train.steps": 12},
    repr([{"policy": p, "train.seed": s} for p in ("none", "inv_sqrt_dk") for s in (0, 1)]))


def run_sweep(experiment_file, sweep_dir, *flags):
    # WANDB_SILENT unset: the sweep itself must keep W&B's banners off the console.
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SILENT"}
    return subprocess.run(
        [sys.executable, "-m", "scale_ablation.sweep", f"--config={experiment_file}",
         f"--workdir={sweep_dir}", "--noreport", *flags],
        cwd=REPO, env={**env, "WANDB_MODE": "offline"}, capture_output=True, text=True,
        timeout=240,
    )


@pytest.mark.slow  # two sweeps in subprocesses, ~15 s; members as they would train alone: above
def test_a_sweep_with_ensembles_ends_as_one_without(tmp_path):
    experiment_file = tmp_path / "experiments" / "two_by_two.py"
    experiment_file.parent.mkdir()
    experiment_file.write_text(EXPERIMENT)
    with_ensembles = run_sweep(experiment_file, tmp_path / "ensemble")
    without = run_sweep(experiment_file, tmp_path / "solo", "--noensemble")
    for result in (with_ensembles, without):
        assert result.returncode == 0, result.stdout + result.stderr
        assert "[sweep] 4/4 done, 0 running, 0 failed (completed=4)" in result.stdout
    assert "[sweep] ensemble of 4:" in with_ensembles.stdout
    assert "ensemble" not in without.stdout
    for result in (with_ensembles, without):
        # A console that reads at a glance: no W&B banners, no per-run step lines, and one
        # line per finished run with the numbers its summary.json holds.
        assert "wandb" not in (result.stdout + result.stderr).lower()
        assert not re.search(r"^\[[^]]*\] step \d+/", result.stdout, re.M)
        for run in read_json(tmp_path / "solo" / "sweep.json")["runs"]:
            sweep_dir = "ensemble" if result is with_ensembles else "solo"
            bpb = read_json(tmp_path / sweep_dir / run["name"] / "summary.json")["final_val_bpb"]
            assert f"[sweep] {run['name']}: completed, val bpb {bpb:.4f}, 12 steps" in result.stdout

    record = read_json(tmp_path / "ensemble" / "sweep.json")
    assert record["runs"] == read_json(tmp_path / "solo" / "sweep.json")["runs"]
    assert [r["status"] for r in record["runs"]] == ["completed"] * 4
    for run in record["runs"]:
        got = read_json(tmp_path / "ensemble" / run["name"] / "summary.json")
        want = read_json(tmp_path / "solo" / run["name"] / "summary.json")
        assert got.keys() == want.keys() and got["status"] == want["status"] == "completed"
        # Who trained together, as the console announced it: one ensemble of 4, or alone.
        first = re.search(r"\[sweep\] ensemble of 4: (\S+?)(, |\n)", with_ensembles.stdout).group(1)
        assert (got["ensemble"], got["ensemble_members"]) == (first, 4)
        assert (want["ensemble"], want["ensemble_members"]) == (run["name"], 1)
        for field in ("final_train_loss", "final_val_loss", "final_val_bpb"):
            assert got[field] == pytest.approx(want[field], rel=RTOL), (run["name"], field)


@pytest.mark.parametrize("programs", [2, 1])
def test_a_signal_during_a_groups_last_step_stops_the_sweep(tmp_path, programs):
    """SIGINT once step 12 of 12 is done. In two programs of two runs: the first program's runs
    complete (their final evaluation is not thrown away) and the sweep stops before the second,
    whose runs it never starts. In one program: every run completes, and the sweep still stops
    (exit 3, rerun to continue), where `--refine` would otherwise start its next round. It
    used to drop the signal and train on."""
    experiment_file = tmp_path / "experiments" / "two_by_two.py"
    experiment_file.parent.mkdir()
    experiment_file.write_text(EXPERIMENT)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SILENT"}
    result = subprocess.run(
        [sys.executable, "-m", "scale_ablation.sweep", f"--config={experiment_file}",
         f"--workdir={tmp_path / 'sweep'}", "--noreport", f"--max_members={4 // programs}"],
        cwd=REPO, env={**env, "WANDB_MODE": "offline", "SCALE_ABLATION_SIGNAL_AT": "12:SIGINT"},
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 3, result.stdout + result.stderr
    between = "[sweep] a stop signal came between groups: group 2/2 not started"
    assert (between in result.stdout) == (programs == 2)
    statuses = [(read_json(path).get("status") if (path := tmp_path / "sweep" / run["name"] /
                                                    "summary.json").exists() else None)
                for run in read_json(tmp_path / "sweep" / "sweep.json")["runs"]]
    done = 4 // programs
    assert statuses.count("completed") == done and statuses.count(None) == 4 - done, statuses


def test_vmapped_and_mapped_members_agree():
    """Accelerators step the members with vmap, a CPU in turn inside one program: both must
    give each member the numbers of its solo step (the CPU tests above cover it end to end)."""
    configs = [config_of(member) for member in list(MEMBERS.values())[:3]]
    tx = optim.make_optimizer(configs[0])
    graphdef = run_setup.init_state(configs[0], tx)[0]
    step = steps.make_train_step(graphdef, tx, 0.0)
    states = [run_setup.init_state(config, tx)[1] for config in configs]
    batches = []
    for config in configs:
        raw = data_lib.make_source(config.data, seed=config.train.seed).train_batch(0, 4, 32)
        batches.append({name: getattr(raw, name) for name in ("inputs", "targets", "weights")})
    keys = jax.numpy.stack([steps.dropout_key(c.train.seed, 0) for c in configs])

    def stacked(trees):
        return jax.tree.map(lambda *xs: jax.numpy.stack(xs), *trees)  # (K, ...)

    outputs = {backend: jax.jit(steps.over_members(step, backend))(
        stacked(states), stacked(batches), keys) for backend in ("gpu", "cpu")}
    solo = [jax.jit(step)(s, b, k) for s, b, k in zip(states, batches, keys, strict=True)]
    for backend, (new_states, metrics) in outputs.items():
        for index, (solo_state, solo_metrics) in enumerate(solo):
            np.testing.assert_allclose(metrics["train/loss"][index], solo_metrics["train/loss"],
                                       rtol=RTOL, err_msg=backend)
            for got, want in zip(jax.tree.leaves(new_states["params"]),
                                 jax.tree.leaves(solo_state["params"]), strict=True):
                np.testing.assert_allclose(got[index], want, rtol=RTOL, atol=1e-6,
                                           err_msg=backend)


def test_a_divergence_inside_a_chunk_keeps_the_last_good_state(trained, tmp_path):
    """With 8 steps per program the diverging step is inside a chunk, where the loop cannot
    read the state; the chunk's end state is frozen at the last good step, and is what the run
    checkpoints: the state the one-step-per-program run kept."""
    solo = trained["solo"]["diverging"]
    chunked = config_of(MEMBERS["diverging"], {
        "train.steps_per_call": 8, "train.eval_every": 8, "train.diag_every": 8})
    summary = train.train(chunked, tmp_path / "chunked")
    before = solo["diverged_at_step"] - 1
    assert summary["diverged_at_step"] == solo["diverged_at_step"] and before % 8
    got = final_state(tmp_path / "chunked", chunked, before)
    want = final_state(trained["root"] / "solo" / "diverging", chunked, before)
    assert int(got["step"]) == before
    for a, b in zip(jax.tree.leaves(got["params"]), jax.tree.leaves(want["params"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3)
