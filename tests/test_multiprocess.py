"""Two `scale_ablation.main` processes on this machine as one JAX program.

Each process has 2 virtual CPU devices and they talk through JAX's distributed runtime (the
coordinator in process 0, gloo collectives), exactly as processes on different hosts would. The
run uses FSDP over all 4 devices, so every parameter is split between the two processes and each
writes its own part of the checkpoints. Interruptions are made deterministic by
SCALE_ABLATION_SIGNAL_AT (the run signals itself after a given step).
"""

import contextlib
import os
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest
from helpers import read_json
from test_sharding import REPO, TINY, command, losses

DEVICES_PER_PROCESS = 2
SETTINGS = {"train.fsdp": 4, "wandb.mode": "offline"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(devices: int, signal_at: str = "") -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "SCALE_ABLATION_SIGNAL_AT") and not k.startswith("SLURM_")}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    if signal_at:
        env["SCALE_ABLATION_SIGNAL_AT"] = signal_at
    return env


def run_two(workdir, signal_at=("", "")) -> list[subprocess.CompletedProcess]:
    """Both processes to the end; signal_at[i]: process i's SCALE_ABLATION_SIGNAL_AT. Each
    result has `.exited`, the monotonic time its process was seen to end."""
    port = free_port()
    with contextlib.ExitStack() as stack:
        processes, logs = [], []
        for rank in (0, 1):
            cluster = [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                       f"--process_id={rank}", "--heartbeat_timeout=10"]
            # Files, not pipes: the loop below polls both processes and reads nothing meanwhile.
            logs.append([stack.enter_context(tempfile.TemporaryFile("w+")) for _ in "oe"])
            processes.append(subprocess.Popen(
                command(workdir, **SETTINGS) + cluster, cwd=REPO,
                env=environment(DEVICES_PER_PROCESS, signal_at[rank]),
                stdout=logs[-1][0], stderr=logs[-1][1], text=True))
        exited = wait_all(processes, timeout=300)
        results = []
        for process, (out, err), when in zip(processes, logs, exited, strict=True):
            out.seek(0)
            err.seek(0)
            results.append(subprocess.CompletedProcess(process.args, process.returncode,
                                                       out.read(), err.read()))
            results[-1].exited = when
    return results


def wait_all(processes: list[subprocess.Popen], timeout: float) -> list[float]:
    """The monotonic time each process was seen to end; kills all and fails after `timeout`."""
    exited = [None] * len(processes)
    deadline = time.monotonic() + timeout
    while None in exited:
        for rank, process in enumerate(processes):
            if exited[rank] is None and process.poll() is not None:
                exited[rank] = time.monotonic()
        if time.monotonic() > deadline:
            for process in processes:
                process.kill()
            pytest.fail(f"the processes did not end within {timeout} s")
        time.sleep(0.05)
    return exited


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process with the same 4 devices."""
    workdir = tmp_path_factory.mktemp("one_process") / "run"
    result = subprocess.run(command(workdir, **SETTINGS), cwd=REPO,
                            env=environment(2 * DEVICES_PER_PROCESS), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("two_processes") / "run"
    results = run_two(workdir)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_two_processes_train_as_one(one_process, two_processes):
    """The logged losses equal one process's (to the 8-device test's tolerance), and only
    process 0 wrote the run files and the W&B run."""
    expected, got = losses(one_process), losses(two_processes)
    # One row per logged step: a second writer would have doubled them.
    assert [s for s, *_ in got] == [s for s, *_ in expected]
    np.testing.assert_allclose([loss for _, loss, _ in got], [loss for _, loss, _ in expected],
                               rtol=2e-5)
    val = [(v_got, v_exp) for (_, _, v_got), (_, _, v_exp) in zip(got, expected, strict=True)
           if v_exp is not None]
    assert val and np.allclose(*zip(*val, strict=True), rtol=2e-5)
    assert len(list((two_processes / "wandb").glob("offline-run-*"))) == 1
    assert read_json(two_processes / "summary.json")["status"] == "completed"
    assert read_json(two_processes / "config.json")["train"]["fsdp"] == 4


def test_each_process_writes_its_part_of_every_checkpoint(two_processes):
    steps = sorted(int(p.name) for p in (two_processes / "checkpoints").iterdir())
    assert steps == [TINY["train.steps"] - TINY["checkpoint.every"], TINY["train.steps"]]
    for step in steps:
        item = two_processes / "checkpoints" / str(step) / "default"
        for rank in (0, 1):
            assert any((item / f"ocdbt.process_{rank}" / "d").iterdir()), (step, rank)
            assert (item / "array_metadatas" / f"process_{rank}").is_file()


@pytest.mark.slow  # minutes on 2 cores: `-m slow`
def test_preempted_then_killed_run_resumes_to_the_uninterrupted_losses(two_processes, tmp_path):
    """SIGTERM to both (exit 3, preempted), rerun; SIGKILL one: the other leaves with one error
    line within the heartbeat bound; rerun: the final losses are the uninterrupted run's."""
    workdir = tmp_path / "run"
    preempted = run_two(workdir, signal_at=("8", "8"))
    assert [r.returncode for r in preempted] == [3, 3], preempted[0].stderr[-3000:]
    summary = read_json(workdir / "summary.json")
    assert (summary["status"], summary["steps_completed"]) == ("preempted", 8)

    killed = run_two(workdir, signal_at=("", "14:SIGKILL"))
    assert killed[1].returncode == -9
    assert killed[0].returncode == 1, killed[0].stderr[-3000:]
    last_line = killed[0].stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: process 0 of 2: a collective with the other processes "
                                "failed"), killed[0].stderr[-3000:]
    assert "Traceback" not in killed[0].stderr
    assert killed[0].exited - killed[1].exited < 60
    assert read_json(workdir / "summary.json")["status"] == "failed"
    assert max(int(p.name) for p in (workdir / "checkpoints").iterdir()) == 12

    resumed = run_two(workdir)
    assert [r.returncode for r in resumed] == [0, 0], resumed[0].stderr[-3000:]
    final, reference = read_json(workdir / "summary.json"), read_json(two_processes / "summary.json")
    assert final["status"] == "completed"
    assert final["final_train_loss"] == reference["final_train_loss"]
    assert final["final_val_loss"] == reference["final_val_loss"]
    assert losses(workdir) == losses(two_processes)
