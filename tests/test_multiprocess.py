"""Two `scale_ablation.main` processes on this machine as one JAX program.

Each process has 2 virtual CPU devices and they talk through JAX's distributed runtime (the
coordinator in process 0, gloo collectives), exactly as processes on different hosts would. The
run uses FSDP over all 4 devices, so every parameter is split between the two processes and each
writes its own part of the checkpoints. Interruptions are made deterministic by
SCALE_ABLATION_SIGNAL_AT (the run signals itself after a given step).
"""

import contextlib
import os
import re
import signal
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
HEARTBEAT = 10  # --heartbeat_timeout, seconds
# The one line a process leaves with when a peer is lost, dead or hung; group 1: why.
LOST_PEER = re.compile(r"error: process (\d) of 2: a collective with the other processes failed, "
                       r"most likely one of them died \((.+)\); restart every process to resume "
                       r"from the last checkpoint")


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
    with contextlib.ExitStack() as stack:
        processes, logs = start_two(workdir, signal_at, stack)
        return results_of(processes, logs, wait_all(processes, timeout=300))


def start_two(workdir, signal_at, stack) -> tuple[list[subprocess.Popen], list]:
    """The two processes started, each writing stdout and stderr to files `stack` closes."""
    port = free_port()
    processes, logs = [], []
    for rank in (0, 1):
        cluster = [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                   f"--process_id={rank}", f"--heartbeat_timeout={HEARTBEAT}"]
        # Files, not pipes: the callers poll the processes and read nothing meanwhile. The
        # caller's stack closes them.
        logs.append([stack.enter_context(tempfile.TemporaryFile("w+"))  # noqa: SIM115
                     for _ in "oe"])
        processes.append(subprocess.Popen(
            command(workdir, **SETTINGS) + cluster, cwd=REPO,
            env=environment(DEVICES_PER_PROCESS, signal_at[rank]),
            stdout=logs[-1][0], stderr=logs[-1][1], text=True))
    return processes, logs


def results_of(processes, logs, exited) -> list[subprocess.CompletedProcess]:
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
    assert [r.returncode for r in results] == [0, 0], both_stderr(results)
    return workdir


def both_stderr(results) -> str:
    """Each process's exit status and stderr, less the C++ stack lines of an abort: which
    process failed first is in the other's log."""
    return "\n".join(
        f"process {rank} exited {r.returncode}:\n" + "\n".join(
            line for line in r.stderr.splitlines() if not line.lstrip().startswith("@ "))[-2500:]
        for rank, r in enumerate(results))


@pytest.mark.slow  # three runs in subprocesses, ~40 s; the step's sharding: test_sharding.py
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


@pytest.mark.slow  # two processes training, ~30 s; one process's checkpoints: the fast tier
def test_each_process_writes_its_part_of_every_checkpoint(two_processes):
    steps = sorted(int(p.name) for p in (two_processes / "checkpoints").iterdir())
    # Finished, the run keeps its final checkpoint only (checkpoint.keep_finished): the older
    # one was removed with both processes' parts.
    assert steps == [TINY["train.steps"]]
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
    assert LOST_PEER.fullmatch(last_line), killed[0].stderr[-3000:]
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


def is_stopped(process: subprocess.Popen) -> bool:
    """The process is stopped (state T in /proc/PID/stat, after its name in parentheses)."""
    with open(f"/proc/{process.pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] in ("T", "t")


def run_with_one_stopped(workdir, stopped: int) -> tuple[subprocess.CompletedProcess, float]:
    """Process `stopped` sends itself SIGSTOP after step 14; the other runs until it ends.
    Returns the other's result and the seconds from the stop being seen to its end. Every
    child is killed and continued before this returns, however it returns."""
    signal_at = ["", ""]
    signal_at[stopped] = "14:SIGSTOP"
    with contextlib.ExitStack() as stack:
        processes, logs = start_two(workdir, signal_at, stack)
        try:
            survivor, deadline, seen = processes[1 - stopped], time.monotonic() + 300, None
            while survivor.poll() is None and time.monotonic() < deadline:
                if seen is None and processes[stopped].poll() is None and is_stopped(
                        processes[stopped]):
                    seen = time.monotonic()
                time.sleep(0.05)
            ended = time.monotonic()
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    os.kill(process.pid, signal.SIGCONT)  # not reaped yet: still this child
                process.wait(timeout=60)
        assert seen is not None, "the process never stopped"
        return results_of(processes, logs, [ended, ended])[1 - stopped], ended - seen


@pytest.mark.slow  # a minute or two on 2 cores: `-m slow`
@pytest.mark.parametrize("stopped", [1, 0], ids=["peer_stopped", "coordinator_stopped"])
def test_a_hung_peer_ends_the_other_within_the_heartbeat_bound(tmp_path, stopped):
    """SIGSTOP to one process (it hangs, its sockets stay open): the other leaves within
    --heartbeat_timeout + SLACK with the dead peer's one line and exit 1, not JAX's abort at
    twice the bound; process 0, when it is the survivor, records the run failed."""
    slack = 8  # the watch's 1 s period, its recording of the members (half the bound at most)
    workdir = tmp_path / "run"
    result, seconds = run_with_one_stopped(workdir, stopped)
    assert result.returncode == 1, result.stderr[-3000:]
    assert seconds <= HEARTBEAT + slack, (seconds, result.stderr[-3000:])
    last_line = result.stderr.strip().splitlines()[-1]
    match = LOST_PEER.fullmatch(last_line)
    assert match and int(match.group(1)) == 1 - stopped, result.stderr[-3000:]
    assert "no heartbeat" in match.group(2) or "did not answer" in match.group(2)
    for noise in ("Traceback", "Check failure", "Fatal Python error"):
        assert noise not in result.stderr, result.stderr[-3000:]
    if stopped == 1:
        summary = read_json(workdir / "summary.json")
        assert summary["status"] == "failed" and "no heartbeat" in summary["error"], summary
