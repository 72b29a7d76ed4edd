"""Process set-up: multi-host start through JAX's own runtime, the persistent compile cache.

Every multi-process launch goes through `maybe_initialize`: Slurm (`srun`, one task per
process) and Cloud TPU slices are detected by `jax.distributed.initialize` itself; anywhere else
(several processes on one machine, a hand-rolled cluster) the coordinator address, process
count and process id are given explicitly (`scale_ablation.main`'s flags of the same names).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import numpy as np
from absl import logging


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What `jax.distributed.initialize` is told; None fields are auto-detected by JAX.

    heartbeat_timeout: seconds without a heartbeat after which a process counts as dead and
    the others stop with an error (JAX's default of 100 s leaves a dead peer's partners idle
    for minutes). shutdown_timeout: seconds a finishing process waits for the others.
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


def launched_multi_host() -> bool:
    """True under Slurm with several tasks or on a multi-worker Cloud TPU slice."""
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return True
    return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def maybe_initialize(mode: str, cluster: Cluster | None = None) -> None:
    """mode: 'auto' | 'on' | 'off'. 'auto' joins a multi-process program when the cluster is
    given explicitly or when launched by Slurm with several tasks or on a multi-host TPU."""
    cluster = cluster or Cluster()
    cluster.check()
    if mode == "off" or (mode == "auto" and not (cluster.explicit or launched_multi_host())):
        return
    # Cross-process collectives between CPU devices (tests, CPU clusters) need an
    # implementation; GPUs and TPUs bring their own and ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=cluster.coordinator_address,
        num_processes=cluster.num_processes,
        process_id=cluster.process_id,
        heartbeat_timeout_seconds=cluster.heartbeat_timeout,
        shutdown_timeout_seconds=cluster.shutdown_timeout,
    )
    logging.info("process %d of %d, %d local devices of %d", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())


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


def enable_compilation_cache(workdir: str) -> None:
    """Persistent XLA cache in `<workdir's parent>/.jax_cache`, shared by a sweep's runs."""
    cache = os.path.join(os.path.dirname(os.path.abspath(workdir)), ".jax_cache")
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
