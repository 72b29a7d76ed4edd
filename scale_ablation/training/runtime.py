"""Process set-up: multi-host start through JAX's own runtime, the persistent compile cache.

Every multi-process launch goes through `maybe_initialize`: Slurm (`srun`, one task per
process) and Cloud TPU slices are detected by `jax.distributed.initialize` itself; anywhere else
(several processes on one machine, a hand-rolled cluster) the coordinator address, process
count and process id are given explicitly (`scale_ablation.main`'s flags of the same names).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What `jax.distributed.initialize` is told; None fields are auto-detected by JAX.

    heartbeat_timeout: seconds without a heartbeat after which a process counts as dead and
    the others stop with an error (JAX's default of 100 s leaves a dead peer's partners idle
    for minutes): `PeerWatch`'s bound; JAX's own, which aborts the process with pages of C++
    log, is set to twice it, so that `PeerWatch` ends first. shutdown_timeout: seconds JAX's
    shutdown barrier waits at exit, once `PeerWatch.stop` has seen every live process finish
    (so they reach it together).
    """

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout: int = 20
    shutdown_timeout: int = 60

    @property
    def explicit(self) -> bool:
        return self.coordinator_address is not None

    def check(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        given = [self.coordinator_address, self.num_processes, self.process_id]
        if any(v is not None for v in given) and None in given:
            raise ValueError("--coordinator_address, --num_processes and --process_id go "
                             "together: give all three or none")
        if self.explicit:
            host, _, port = self.coordinator_address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"--coordinator_address={self.coordinator_address}: "
                                 "expected HOST:PORT")
            if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
                raise ValueError(f"--process_id={self.process_id} must be in "
                                 f"[0, --num_processes={self.num_processes})")
        if self.heartbeat_timeout < 1 or self.shutdown_timeout < 1:
            raise ValueError("--heartbeat_timeout and --shutdown_timeout must be >= 1 second")

    @property
    def jax_heartbeat_timeout(self) -> int:
        """JAX's own bound: a backstop behind `PeerWatch`'s (`heartbeat_timeout`)."""
        return 2 * self.heartbeat_timeout


def launched_multi_host() -> bool:
    """True under Slurm with several tasks or on a multi-worker Cloud TPU slice."""
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return True
    return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def maybe_initialize(mode: str, cluster: Cluster | None = None) -> PeerWatch | None:
    """mode: 'auto' | 'on' | 'off'. 'auto' joins a multi-process program when the cluster is
    given explicitly or when launched by Slurm with several tasks or on a multi-host TPU.
    Returns the started `PeerWatch` of a program of several processes, else None."""
    cluster = cluster or Cluster()
    cluster.check()
    if mode == "off" or (mode == "auto" and not (cluster.explicit or launched_multi_host())):
        return None
    # Cross-process collectives between CPU devices (tests, CPU clusters) need an
    # implementation; GPUs and TPUs bring their own and ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=cluster.coordinator_address,
        num_processes=cluster.num_processes,
        process_id=cluster.process_id,
        heartbeat_timeout_seconds=cluster.jax_heartbeat_timeout,
        shutdown_timeout_seconds=cluster.shutdown_timeout,
    )
    logging.info("process %d of %d, %d local devices of %d", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())
    if jax.process_count() == 1:
        return None
    from jax._src import distributed  # the client JAX connected (orbax reads it there too)

    watch = PeerWatch(distributed.global_state.client, jax.process_index(), jax.process_count(),
                      cluster.heartbeat_timeout)
    watch.start()
    # Registered after JAX's own shutdown, so run before it (and after W&B's and orbax's, later
    # registered): a process that ends normally says so, then waits for its peers to say so.
    atexit.register(watch.stop)
    return watch


def agreed_signal(local: int | None) -> int | None:
    """The signal any process of the program received (the largest number), else None.

    A preemption signal reaches the processes at slightly different steps; all of them must
    stop at the same one, or some wait in the next step's collectives for peers that are
    checkpointing. One process: `local` itself, at no cost.
    """
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    received = multihost_utils.process_allgather(np.int32(local or 0))  # (processes,)
    return int(received.max()) or None


def lost_peer_message(error: Exception) -> str:
    """One line for a collective that failed in a multi-process run: almost always a peer
    that died (its sockets closed), which the other processes cannot tell from anything else."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return (f"process {jax.process_index()} of {jax.process_count()}: a collective with the "
            f"other processes failed, most likely one of them died ({first_line[:300]}); "
            "restart every process to resume from the last checkpoint")


_HEARTBEATS = "scale_ablation/heartbeat/"  # a directory of JAX's key-value store
_DONE = "done"  # the heartbeat of a process that ended normally


class PeerWatch:
    """Ends this process when a peer stops answering, as a dead peer's collective error does
    (`scale_ablation.main`): its members recorded failed, `lost_peer_message`, exit status 1.

    A dead peer's partners learn it from their next collective (its sockets close); a hung one
    (stopped, swapped out, stuck in the kernel) keeps its sockets open, and JAX's own heartbeat
    check aborts the process with pages of C++ log and no summary.json (a Python callback for it
    cannot be given: jaxlib cannot pass it the status). So each process writes a counter to
    JAX's key-value store every `period` seconds and reads the others': a peer whose counter has
    not moved for `timeout` seconds, or a coordinator that has not answered for as long, is
    lost. A process that ends normally writes `_DONE` and waits for its live peers to write it
    too (`stop`). The members come from `record`, a hook of every step. `end` is `os._exit` but
    in tests.
    """

    def __init__(self, client: Any, rank: int, count: int, timeout: float,
                 period: float = 1.0, end: Callable[[int], Any] = os._exit) -> None:
        self.client, self.rank, self.timeout, self.period, self._end = (
            client, rank, timeout, period, end)
        self.members: dict[int, Any] = {}
        self._stopping = threading.Event()
        self._ended = threading.Event()  # `lose` ended this process (its `end`)
        self._lock = threading.Lock()
        now = time.monotonic()
        self._answered = now  # when the key-value store (the coordinator) last answered
        self._moved = {peer: now for peer in range(count) if peer != rank}  # counter last moved
        self._beats: dict[int, str | None] = {}

    def record(self, member: Any, tick: Any) -> None:
        """A step hook (`hooks.Periodic(1, watch.record, reads_state=False)`)."""
        self.members[id(member)] = member

    def start(self) -> None:
        for target in (self._beat, self._check):
            threading.Thread(target=target, name=f"peer_watch{target.__name__}",
                             daemon=True).start()

    def stop(self) -> None:
        """This process ends normally: stop watching, say so (a few periods at most: a hung
        coordinator must not hold up the exit), then wait for the peers to say so too.

        JAX's shutdown barrier, next at exit, aborts every process with pages of C++ log when
        one reaches it more than its timeout after another (a slow W&B or checkpoint finish on
        a loaded machine is enough), though every run's files are complete. Waiting here, where
        a slow peer (still beating) is told from a dead one, lets all reach it together; a live
        peer is waited for as long as it takes, as in every collective of training."""
        self._stopping.set()
        _bounded(lambda: self.client.key_value_set(f"{_HEARTBEATS}{self.rank}", _DONE,
                                                   allow_overwrite=True), 5 * self.period)
        if not self._ended.is_set():
            self.await_peers()

    def await_peers(self) -> None:
        """Until every peer has written `_DONE`. A peer lost meanwhile: one line and exit
        status 0 (this process's runs are complete), skipping JAX's barrier, which would wait
        for it and abort."""
        waiting = list(self._moved)
        while waiting:
            entries = _bounded(lambda: self.client.key_value_dir_get(_HEARTBEATS), self.period)
            if entries is not None:
                self.observe(_beats_of(entries), time.monotonic())
            waiting = [peer for peer in self._moved if self._beats.get(peer) != _DONE]
            if waiting and (reason := self.lost(time.monotonic())) is not None:
                print(f"warning: process {self.rank}: {reason} after this process finished; "
                      "its runs are complete, leaving without JAX's shutdown",
                      file=sys.stderr, flush=True)
                self._end(0)
                return
            if waiting:
                time.sleep(self.period)

    def observe(self, beats: dict[int, str], now: float) -> None:
        """The peers' heartbeats (rank -> counter) as read at `now`."""
        with self._lock:
            self._answered = now
            for peer in self._moved:
                if beats.get(peer) != self._beats.get(peer):
                    self._beats[peer], self._moved[peer] = beats.get(peer), now

    def lost(self, now: float) -> str | None:
        """Why a peer counts as lost at `now`, or None."""
        with self._lock:
            if now - self._answered > self.timeout:
                return (f"the coordinator (process 0) did not answer for "
                        f"{now - self._answered:.0f} s")
            for peer, moved in self._moved.items():
                if self._beats.get(peer) != _DONE and now - moved > self.timeout:
                    return f"process {peer} sent no heartbeat for {now - moved:.0f} s"
        return None

    def restart_clocks(self, now: float) -> None:
        """This process itself stood still (stopped, swapped out): nobody's silence counts."""
        with self._lock:
            self._answered = now
            self._moved = dict.fromkeys(self._moved, now)

    def _beat(self) -> None:
        beat = 0
        while not self._stopping.is_set():
            beat += 1
            try:
                self.client.key_value_set(f"{_HEARTBEATS}{self.rank}", str(beat),
                                          allow_overwrite=True)
                entries = self.client.key_value_dir_get(_HEARTBEATS)
            except Exception:  # the store failing: its silence is what `lost` judges
                self._stopping.wait(self.period)
                continue
            self.observe(_beats_of(entries), time.monotonic())
            self._stopping.wait(self.period)

    def _check(self) -> None:
        last = time.monotonic()
        while not self._stopping.wait(self.period):
            now = time.monotonic()
            if now - last > self.timeout / 2:
                self.restart_clocks(now)
            last = now
            if (reason := self.lost(now)) is not None:
                self.lose(reason)
                return

    def lose(self, reason: str) -> None:
        """Record the members failed (for half the timeout at most: a member's checkpoint
        writer may wait on the lost peer), print the one line and end the process."""
        error = TimeoutError(reason)
        _bounded(lambda: self._record_failed(error), self.timeout / 2)
        print(f"error: {lost_peer_message(error)}", file=sys.stderr, flush=True)
        self._ended.set()
        self._end(1)

    def _record_failed(self, error: Exception) -> None:
        for member in list(self.members.values()):
            if member.summary is None:
                with contextlib.suppress(Exception):
                    member.fail(error)


def _beats_of(entries: list[tuple[str, str]]) -> dict[int, str]:
    """The heartbeat directory's (key, value) entries as rank -> counter (or `_DONE`)."""
    return {int(key.rsplit("/", 1)[-1]): value for key, value in entries}


def _bounded(action: Callable[[], Any], seconds: float) -> Any:
    """`action()` in a daemon thread, waited for `seconds` at most: its result, or None when
    it did not return in time or raised."""
    result = []

    def attempt() -> None:
        with contextlib.suppress(Exception):  # a failing store: its silence is what is judged
            result.append(action())

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(seconds)
    return result[0] if result else None


CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


def enable_compilation_cache(workdir: str) -> None:
    """Persistent XLA cache in `<workdir's parent>/.jax_cache`, shared by a sweep's runs, or
    in the directory the user's own `JAX_COMPILATION_CACHE_DIR` names (JAX's variable: one
    cache for every workdir, as the test suite uses)."""
    cache = (os.environ.get(CACHE_VARIABLE)
             or os.path.join(os.path.dirname(os.path.abspath(workdir)), ".jax_cache"))
    jax.config.update("jax_compilation_cache_dir", cache)
    # Small models compile in well under the default 1 s threshold, yet a sweep compiles them
    # again and again: cache everything.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def make_experiments_importable(spec: str) -> None:
    """Put the experiment file's import root on sys.path (`from experiments import base`
    works wherever the command runs from). Entry points call this; library code never does."""
    from scale_ablation.training import experiment_files as experiment

    root = experiment.import_root(spec)
    if root not in sys.path:
        sys.path.insert(0, root)


def normalise_environment(verbose: bool = False) -> None:
    """W&B's own console lines (its banners, per run) only when asked for (`verbose`); an
    exported-but-empty WANDB_MODE means "unset" to us, and wandb's settings reject it."""
    if os.environ.get("WANDB_MODE") == "":
        del os.environ["WANDB_MODE"]
    if not verbose:
        os.environ.setdefault("WANDB_SILENT", "true")
