"""Data-parallel and FSDP runs on 8 virtual CPU devices against a run on one device.

Each run is a subprocess: the number of host devices is fixed when JAX starts.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from scale_ablation.training import hooks

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


@pytest.mark.slow  # two runs on 8 virtual devices, ~1 min; the shardings: by inspection above
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


@pytest.mark.slow  # minutes on 2 cores: `-m slow`
def test_fsdp_run_resumes_from_its_checkpoint(tmp_path):
    """SIGTERM an 8-device FSDP run after step 8 (hooks.SIGNAL_AT_ENV, no race against the clock),
    rerun it: the final loss equals an uninterrupted run's."""
    reference = run(tmp_path / "reference", devices=8, **{"train.fsdp": 4})
    workdir = tmp_path / "interrupted"
    env = {**environment(8), hooks.SIGNAL_AT_ENV: "8:SIGTERM"}
    stopped = subprocess.run(command(workdir, **{"train.fsdp": 4}), cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    interrupted = json.loads((workdir / "summary.json").read_text())
    assert interrupted["status"] == "preempted"
    assert interrupted["steps_completed"] == 8
    resumed = run(workdir, devices=8, **{"train.fsdp": 4})
    assert resumed["status"] == "completed"
    assert resumed["final_train_loss"] == reference["final_train_loss"]
    assert resumed["final_val_loss"] == reference["final_val_loss"]


# Run under 8 host devices: prepare a tiny run and print, per state leaf and batch field, its
# global shape, partition spec and the shape of every addressable shard.
INSPECT = """
import json, sys
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import run_setup
import jax
config = experiment.apply_overrides(experiment.load_config("experiments/base.py:quick"),
                                    json.loads(sys.argv[2]))
run = run_setup.prepare(config, sys.argv[1])
batch = run_setup.to_device_batch(run.source.train_batch(0, config.train.batch_size,
                                                         config.data.seq_len), run.batch_sharding)
def describe(tree):
    return {jax.tree_util.keystr(path): {"shape": list(x.shape),
                                         "shards": [list(s.data.shape) for s in x.addressable_shards],
                                         "devices": len({s.device for s in x.addressable_shards})}
            for path, x in jax.tree_util.tree_leaves_with_path(tree)}
print(json.dumps({"devices": jax.device_count(), "params": describe(run.state["params"]),
                  "opt_state": describe(run.state["opt_state"]), "batch": describe(batch)}))
"""


def inspect(tmp_path, fsdp: int) -> dict:
    overrides = {**TINY, "train.fsdp": fsdp}
    result = subprocess.run([sys.executable, "-c", INSPECT, str(tmp_path / "run"),
                             json.dumps(overrides)], cwd=REPO, env=environment(8),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("fsdp", [1, 4], ids=["data_parallel", "fsdp4"])
def test_shardings_by_inspection(tmp_path, fsdp):
    """The batch's rows split 8 ways; with fsdp=4 each parameter (and its Adam moments) whose
    largest dimension 4 divides is split 4 ways along it, the rest replicated; fsdp=1
    replicates every parameter."""
    seen = inspect(tmp_path, fsdp)
    assert seen["devices"] == 8
    for name, field in seen["batch"].items():
        rows, length = field["shape"]
        assert rows == TINY["train.batch_size"], name
        assert field["devices"] == 8 and field["shards"] == [[rows // 8, length]] * 8, name
    split = 0
    for name, leaf in {**seen["params"], **seen["opt_state"]}.items():
        shape = leaf["shape"]
        assert leaf["devices"] == 8 and len(leaf["shards"]) == 8, name
        divisible = [axis for axis, size in enumerate(shape) if size % fsdp == 0]
        if fsdp == 1 or not divisible:
            assert leaf["shards"] == [shape] * 8, name
            continue
        axis = max(divisible, key=lambda a: (shape[a], -a))  # the largest; the first of equals
        expected = [size // fsdp if a == axis else size for a, size in enumerate(shape)]
        assert leaf["shards"] == [expected] * 8, (name, leaf)
        split += 1
    if fsdp > 1:  # every kernel and embedding has a dimension of 32, 64, 128 or 256
        kernels = [n for n in seen["params"] if "kernel" in n or "embedding" in n]
        assert kernels and split >= 3 * len(kernels)  # the parameter and its two moments


def test_fsdp_that_does_not_divide_the_devices_is_refused(tmp_path):
    result = subprocess.run(command(tmp_path / "run", **{"train.fsdp": 3}), cwd=REPO,
                            env=environment(8), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "train.fsdp=3" in result.stderr
    assert not (tmp_path / "run").exists()
