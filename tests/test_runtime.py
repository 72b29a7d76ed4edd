"""How a process joins a multi-process program: which launches call jax.distributed.initialize
and with what, and bad cluster flags refused in one line before anything is written.

The launches themselves run in tests/test_multiprocess.py (explicit addresses) and
tests/test_slurm.py (Slurm detection); a TPU slice cannot run here, so its path is checked to be
the same call with JAX's own detection.
"""

import subprocess

import jax
import pytest
from test_sharding import REPO, command

from scale_ablation.training import runtime


@pytest.fixture
def calls(monkeypatch):
    """jax.distributed.initialize and jax.config.update as recorders (this test process must
    not join anything)."""
    recorded = {"initialize": [], "config": []}
    monkeypatch.setattr(jax.distributed, "initialize",
                        lambda **kwargs: recorded["initialize"].append(kwargs))
    monkeypatch.setattr(jax.config, "update",
                        lambda name, value: recorded["config"].append((name, value)))
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    for var in ("SLURM_NTASKS", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(var, raising=False)
    return recorded


def test_one_process_joins_nothing(calls):
    runtime.maybe_initialize("auto")
    assert calls == {"initialize": [], "config": []}


def test_explicit_cluster_is_passed_on_with_the_timeouts(calls):
    cluster = runtime.Cluster("127.0.0.1:4321", 2, 1, heartbeat_timeout=7, shutdown_timeout=9)
    runtime.maybe_initialize("auto", cluster)
    assert calls["initialize"] == [{
        "coordinator_address": "127.0.0.1:4321", "num_processes": 2, "process_id": 1,
        "heartbeat_timeout_seconds": 7, "shutdown_timeout_seconds": 9}]
    assert ("jax_cpu_collectives_implementation", "gloo") in calls["config"]


@pytest.mark.parametrize("env", [{"SLURM_NTASKS": "2"}, {"TPU_WORKER_HOSTNAMES": "w0,w1"}],
                         ids=["slurm", "tpu_slice"])
def test_slurm_and_tpu_slices_use_jax_detection_through_the_same_call(calls, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runtime.maybe_initialize("auto")
    defaults = runtime.Cluster()
    assert calls["initialize"] == [{
        "coordinator_address": None, "num_processes": None, "process_id": None,
        "heartbeat_timeout_seconds": defaults.heartbeat_timeout,
        "shutdown_timeout_seconds": defaults.shutdown_timeout}]


def test_off_wins_over_detection(calls, monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "2")
    runtime.maybe_initialize("off")
    assert calls["initialize"] == []


def test_agreed_signal_of_one_process_is_its_own():
    assert runtime.agreed_signal(None) is None
    assert runtime.agreed_signal(15) == 15


@pytest.mark.parametrize("flags, message", [
    (["--coordinator_address=127.0.0.1:4321", "--num_processes=2"], "go together"),
    (["--coordinator_address=localhost", "--num_processes=2", "--process_id=0"], "HOST:PORT"),
    (["--coordinator_address=127.0.0.1:4321", "--num_processes=2", "--process_id=2"],
     "--process_id=2"),
    (["--heartbeat_timeout=0"], "--heartbeat_timeout"),
])
def test_bad_cluster_flags_fail_in_one_line_before_the_workdir(tmp_path, flags, message):
    workdir = tmp_path / "run"
    result = subprocess.run([*command(workdir), *flags], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert not workdir.exists()

