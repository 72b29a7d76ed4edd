"""How a process joins a multi-process program: which launches call jax.distributed.initialize
and with what, and bad cluster flags refused in one line before anything is written.

The launches themselves run in tests/test_multiprocess.py (explicit addresses) and
tests/test_slurm.py (Slurm detection); a TPU slice cannot run here, so its path is checked to be
the same call with JAX's own detection.
"""

import subprocess
import sys
import threading
import time

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
    """JAX's heartbeat bound is twice ours: a backstop behind `PeerWatch`, which ends first."""
    cluster = runtime.Cluster("127.0.0.1:4321", 2, 1, heartbeat_timeout=7, shutdown_timeout=9)
    runtime.maybe_initialize("auto", cluster)
    assert calls["initialize"] == [{
        "coordinator_address": "127.0.0.1:4321", "num_processes": 2, "process_id": 1,
        "heartbeat_timeout_seconds": 14, "shutdown_timeout_seconds": 9}]
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
        "heartbeat_timeout_seconds": 2 * defaults.heartbeat_timeout,
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



class Store:
    """JAX's key-value store as PeerWatch uses it; `answering` False: calls block (a stopped
    coordinator)."""

    def __init__(self):
        self.values, self.answering = {}, threading.Event()
        self.answering.set()

    def key_value_set(self, key, value, allow_overwrite=False):
        self.answering.wait()
        self.values[key] = value

    def key_value_dir_get(self, prefix):
        self.answering.wait()
        return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


class Member:
    def __init__(self, summary=None):
        self.summary, self.failed = summary, []

    def fail(self, error):
        self.failed.append(error)


def watch_with(store, timeout=0.6, rank=0, count=2):
    ended = threading.Event()
    watch = runtime.PeerWatch(store, rank, count, timeout, period=0.05,
                              end=lambda code: ended.set() or ended.__setattr__("code", code))
    return watch, ended


def test_a_beating_peer_is_not_lost_and_a_silent_one_is(capsys):
    """A peer's counter moving keeps it alive; once it stops, the watch records the running
    member failed (the finished one not), prints the one line and ends with status 1, within
    the timeout and a few periods."""
    store = Store()
    watch, ended = watch_with(store)
    running, finished = Member(), Member(summary={"status": "completed"})
    watch.record(running, None)
    watch.record(finished, None)
    watch.start()
    try:
        for beat in range(30):  # 1.5 s, more than twice the timeout
            store.values["scale_ablation/heartbeat/1"] = str(beat)
            time.sleep(0.05)
        assert not ended.is_set()
        silent = time.monotonic()
        assert ended.wait(5)
        # Its last beat was seen up to a period after it was written.
        assert 0.6 - 0.05 <= time.monotonic() - silent <= 0.6 + 0.5
    finally:
        watch.stop()
    assert ended.code == 1 and finished.failed == []
    (error,) = running.failed
    assert isinstance(error, TimeoutError) and "process 1 sent no heartbeat" in str(error)
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: process 0 of 1: a collective with the other processes failed")
    assert "process 1 sent no heartbeat" in line and "\n" not in line


def test_a_peer_that_ended_normally_is_not_lost():
    store = Store()
    store.values["scale_ablation/heartbeat/1"] = "done"
    watch, ended = watch_with(store)
    watch.start()
    try:
        assert not ended.wait(1.5)
    finally:
        watch.stop()
    assert store.values["scale_ablation/heartbeat/0"] == "done"


def test_a_coordinator_that_stops_answering_is_lost_too():
    store = Store()
    watch, ended = watch_with(store, rank=1)
    watch.start()
    try:
        for beat in range(10):
            store.values["scale_ablation/heartbeat/0"] = str(beat)
            time.sleep(0.05)
        store.answering.clear()
        assert ended.wait(5)
    finally:
        store.answering.set()
        watch.stop()


def test_the_clocks_restart_after_this_process_stood_still():
    """Stopped itself for longer than the timeout, a process does not blame its peers."""
    watch, _ = watch_with(Store(), timeout=10)
    watch.observe({1: "7"}, now=100.0)
    assert watch.lost(105.0) is None
    watch.observe({1: "7"}, now=111.0)  # the coordinator answers; the peer's counter is stuck
    assert watch.lost(112.0) == "process 1 sent no heartbeat for 12 s"
    assert watch.lost(122.0).startswith("the coordinator (process 0) did not answer for 11 s")
    watch.restart_clocks(112.0)
    assert watch.lost(121.0) is None
    watch.observe({1: "8"}, now=121.0)
    assert watch.lost(130.0) is None


def watch_finishing(store, timeout=0.6):
    ended = threading.Event()
    watch = runtime.PeerWatch(store, 0, 2, timeout, period=0.05,
                              end=lambda code: ended.set() or ended.__setattr__("code", code))
    return watch, ended


def beat_then(store, seconds, last):
    """Peer 1 beating for `seconds`, then writing `last` (its done, or nothing: silence)."""
    def peer():
        for beat in range(int(seconds / 0.05)):
            store.values["scale_ablation/heartbeat/1"] = str(beat)
            time.sleep(0.05)
        if last is not None:
            store.values["scale_ablation/heartbeat/1"] = last
    threading.Thread(target=peer, daemon=True).start()


def test_a_finished_process_waits_for_a_slow_peer_to_finish_too(capsys):
    """Its peer still beating, a finished process waits until the peer says it is done (here
    five times the heartbeat timeout later), so that both reach JAX's shutdown barrier together;
    then it leaves at once, with nothing printed."""
    store = Store()
    watch, ended = watch_finishing(store)
    beat_then(store, 3.0, "done")
    started = time.monotonic()
    watch.stop()
    assert 3.0 <= time.monotonic() - started <= 3.0 + 0.5
    assert store.values["scale_ablation/heartbeat/0"] == "done"
    assert not ended.is_set() and capsys.readouterr().err == ""


def test_a_peer_lost_after_this_process_finished_ends_it_with_status_0(capsys):
    """This process's runs are complete: one warning line, exit status 0, within the timeout."""
    store = Store()
    watch, ended = watch_finishing(store)
    beat_then(store, 0.3, None)
    started = time.monotonic()
    watch.stop()
    assert ended.code == 0 and time.monotonic() - started <= 0.3 + 0.6 + 0.5
    line = capsys.readouterr().err.strip()
    assert line.startswith("warning: process 0: process 1 sent no heartbeat") and "\n" not in line


END_LATE = """
import sys, time
from scale_ablation.training import runtime
rank, port = int(sys.argv[1]), sys.argv[2]
runtime.maybe_initialize("on", runtime.Cluster(f"127.0.0.1:{port}", 2, rank, 10, 3))
if rank == 0:
    time.sleep(8)  # a finish (W&B, checkpoints) this much slower than the peer's
print("finished", flush=True)
"""


@pytest.mark.slow  # two JAX processes, ~15 s
def test_a_process_finishing_later_than_the_shutdown_timeout_still_exits_cleanly(tmp_path):
    """JAX's shutdown barrier aborts both processes (SIGABRT, pages of C++ log) when one reaches
    it more than --shutdown_timeout (3 s here) after the other (as it did before
    `PeerWatch.stop` waited); `PeerWatch.stop` waits for a live peer first, so both exit 0."""
    from test_multiprocess import environment, free_port

    port = str(free_port())
    processes = [subprocess.Popen([sys.executable, "-c", END_LATE, str(rank), port], cwd=REPO,
                                  env=environment(1), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    results = [process.communicate(timeout=120) for process in processes]
    for process, (out, err) in zip(processes, results, strict=True):
        assert process.returncode == 0 and out.strip() == "finished", err[-2000:]
