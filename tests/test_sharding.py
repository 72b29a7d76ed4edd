"""Data-parallel and FSDP runs on 8 virtual CPU devices against a run on one device.

Each run is a subprocess: the number of host devices is fixed when JAX starts.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
EIGHT_DEVICES = "--xla_force_host_platform_device_count=8"
TINY = {
    "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.head_dim": 16,
    "data.seq_len": 32, "data.val_batches": 1, "train.batch_size": 8, "train.steps": 24,
    "train.warmup_steps": 4, "train.log_every": 4, "train.eval_every": 12,
    "train.diag_every": 12, "checkpoint.every": 6, "wandb.mode": "disabled",
    "train.compilation_cache": False,
}


def command(workdir, **overrides) -> list[str]:
    flags = [f"--config.{k}={v}" for k, v in {**TINY, **overrides}.items()]
    return [sys.executable, "-m", "scale_ablation.main", "--config=experiments/base.py:quick",
            f"--workdir={workdir}", *flags]


def environment(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if devices > 1:
        env["XLA_FLAGS"] = EIGHT_DEVICES
    return env


def run(workdir, devices: int, **overrides) -> dict:
    result = subprocess.run(command(workdir, **overrides), cwd=REPO, env=environment(devices),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((pathlib.Path(workdir) / "summary.json").read_text())


def losses(workdir) -> list[tuple[int, float, float | None]]:
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]
    return [(r["step"], r["train/loss"], r.get("val/loss")) for r in rows if "train/loss" in r]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("one_device") / "run"
    run(workdir, devices=1)
    return workdir


@pytest.mark.parametrize("fsdp", [1, 4], ids=["data_parallel", "fsdp4"])
def test_eight_devices_match_one(one_device, tmp_path, fsdp):
    """Same losses at every logged step to float32 round-off (the cross-device reductions sum
    in another order, nothing else differs)."""
    run(tmp_path / "run", devices=8, **{"train.fsdp": fsdp})
    expected, got = losses(one_device), losses(tmp_path / "run")
    assert [s for s, *_ in got] == [s for s, *_ in expected]
    np.testing.assert_allclose([loss for _, loss, _ in got], [loss for _, loss, _ in expected],
                               rtol=2e-5)
    val = [(v_got, v_exp) for (_, _, v_got), (_, _, v_exp) in zip(got, expected, strict=True)
           if v_exp is not None]
    assert val and np.allclose(*zip(*val, strict=True), rtol=2e-5)


def test_fsdp_run_resumes_from_its_checkpoint(tmp_path):
    """SIGTERM an 8-device FSDP run, rerun it: the final loss equals an uninterrupted run's."""
    reference = run(tmp_path / "reference", devices=8, **{"train.fsdp": 4})
    workdir = tmp_path / "interrupted"
    process = subprocess.Popen(command(workdir, **{"train.fsdp": 4}), cwd=REPO,
                               env=environment(8), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "run never logged"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 3
    interrupted = json.loads((workdir / "summary.json").read_text())
    assert interrupted["status"] == "preempted"
    assert interrupted["steps_completed"] < TINY["train.steps"]
    resumed = run(workdir, devices=8, **{"train.fsdp": 4})
    assert resumed["status"] == "completed"
    assert resumed["final_train_loss"] == reference["final_train_loss"]
    assert resumed["final_val_loss"] == reference["final_val_loss"]


def test_fsdp_that_does_not_divide_the_devices_is_refused(tmp_path):
    result = subprocess.run(command(tmp_path / "run", **{"train.fsdp": 3}), cwd=REPO,
                            env=environment(8), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "train.fsdp=3" in result.stderr
    assert not (tmp_path / "run").exists()
