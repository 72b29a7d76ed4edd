"""launch/slurm.sbatch submitted for real to a one-node Slurm cluster on this machine.

The cluster comes from launch/slurm_local_cluster.sh (root: it installs and starts munge,
slurmctld and slurmd). The script's GPU defaults are overridden on the sbatch command line, as a
user on a CPU partition would. Two tasks with 2 virtual CPU devices each form one JAX program
through jax.distributed's own Slurm detection; its losses are compared with one process on 4
devices, and a run stopped by the time-limit warning and requeued with the uninterrupted run.
"""

import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest
from helpers import read_json
from test_sharding import REPO, TINY, command, losses
from test_sweep import REPORT_STATUSES, write_experiment

# A cluster and jobs that queue, ~2 min together: the slow tier (CI runs it as root).
pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CLUSTER = REPO / "launch" / "slurm_local_cluster.sh"
# Long enough that a warning sent once step 10 is logged arrives well before the end.
LONG = {**TINY, "train.steps": 100, "train.log_every": 5, "train.eval_every": 50,
        "train.diag_every": 50, "checkpoint.every": 25, "train.fsdp": 4}
CPU_PARTITION = ["--partition=cpu", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                 "--gpus-per-task=0", "--time=10"]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def cannot_start_slurm() -> str | None:
    """Why the local cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "launch/slurm_local_cluster.sh needs root to install and start Slurm"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it"
    return None


@pytest.fixture(scope="module")
def cluster():
    if reason := cannot_start_slurm():
        pytest.skip(reason)
    was_up = subprocess.run(["bash", CLUSTER, "status"], capture_output=True).returncode == 0
    started = subprocess.run(["bash", CLUSTER, "start"], capture_output=True, text=True,
                             timeout=900)
    assert started.returncode == 0, started.stderr
    yield
    if not was_up:
        subprocess.run(["bash", CLUSTER, "stop"], capture_output=True, timeout=120)


def environment() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("XLA_FLAGS", "SCALE_ABLATION_SIGNAL_AT")}
    return env | {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def submit(tmp_path, options: list[str], *script_args: str) -> str:
    result = subprocess.run(
        ["sbatch", "--parsable", *options, f"--output={tmp_path}/slurm-%j.out",
         "launch/slurm.sbatch", *script_args],
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job(job_id: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def wait_for(job_id: str, timeout: float = 600, until=lambda info: False) -> dict[str, str]:
    """Job info once the job ended or `until(info)` holds; cancels the job after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        info = job(job_id)
        if info.get("JobState") in ENDED or until(info):
            return info
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], timeout=30)
            pytest.fail(f"job {job_id} still {info.get('JobState')} after {timeout} s")
        time.sleep(1)


def main_args(workdir) -> list[str]:
    return command(workdir, **LONG)[3:]  # the flags after `python -m scale_ablation.main`


@pytest.fixture(scope="module")
def one_process(cluster, tmp_path_factory):
    """The reference, one process on 4 devices (needs no Slurm; computed only where the Slurm
    runs it is compared with can be)."""
    workdir = tmp_path_factory.mktemp("one_process") / "run"
    env = environment() | {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    result = subprocess.run(command(workdir, **LONG), cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("slurm_run")
    job_id = submit(tmp_path, CPU_PARTITION, *main_args(tmp_path / "run"))
    info = wait_for(job_id)
    log = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    return tmp_path / "run", log


def test_two_slurm_tasks_train_as_one_process(one_process, slurm_run):
    workdir, log = slurm_run
    # Both tasks ran the whole run, as processes 0 and 1 of one program.
    assert log.count("completed: ") == 2
    expected, got = losses(one_process), losses(workdir)
    assert [s for s, *_ in got] == [s for s, *_ in expected]
    np.testing.assert_allclose([loss for _, loss, _ in got], [loss for _, loss, _ in expected],
                               rtol=2e-5)
    for rank in (0, 1):
        assert (workdir / "checkpoints" / str(LONG["train.steps"]) / "default"
                / f"ocdbt.process_{rank}").is_dir()


@pytest.mark.slow  # minutes on 2 cores: `-m slow`
def test_time_limit_warning_checkpoints_requeues_and_resumes(slurm_run, tmp_path):
    """USR1 to the batch shell, as --signal=B:USR1@... sends it before the time limit: the
    tasks stop at one step, the job requeues itself and ends with the uninterrupted losses."""
    workdir = tmp_path / "run"
    job_id = submit(tmp_path, CPU_PARTITION, *main_args(workdir))
    metrics = workdir / "metrics.jsonl"
    wait_for(job_id, until=lambda _: metrics.exists() and '"step": 10,' in metrics.read_text())
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True, timeout=30)
    info = wait_for(job_id)
    log = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    stopped = re.findall(r"preempted: \S+ after (\d+) steps", log)
    assert stopped and int(stopped[0]) < LONG["train.steps"], log[-3000:]
    assert "scontrol requeue" in log
    final, reference = read_json(workdir / "summary.json"), read_json(slurm_run[0] / "summary.json")
    assert final["status"] == "completed"
    assert final["final_train_loss"] == reference["final_train_loss"]
    assert final["final_val_loss"] == reference["final_val_loss"]
    assert losses(workdir) == losses(slurm_run[0])


def test_sweep_on_one_node(cluster, tmp_path):
    """`slurm.sbatch sweep`: the sweep's runs are single-process, whatever the job's tasks."""
    spec = f"{write_experiment(tmp_path)}:report"
    options = ["--partition=cpu", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2",
               "--gpus-per-task=0", "--time=10"]
    job_id = submit(tmp_path, options, "sweep", f"--config={spec}",
                    f"--workdir={tmp_path / 'sweep'}")
    info = wait_for(job_id)
    log = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    statuses = [read_json(path)["status"] for path in (tmp_path / "sweep").glob("*/summary.json")]
    assert sorted(statuses) == sorted(REPORT_STATUSES)
    assert (tmp_path / "sweep" / "report" / "summary.md").is_file()
