"""Process set-up: multi-host start through JAX's own runtime, the persistent compile cache."""

from __future__ import annotations

import os
import sys

import jax
from absl import logging


def launched_multi_host() -> bool:
    """True under Slurm with several tasks or on a multi-worker Cloud TPU slice."""
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return True
    return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def maybe_initialize(mode: str) -> None:
    """mode: 'auto' | 'on' | 'off'. jax.distributed reads Slurm's and the TPU runtime's
    environment itself, so no addresses are passed here."""
    if mode == "on" or (mode == "auto" and launched_multi_host()):
        jax.distributed.initialize()
        logging.info("process %d of %d, %d local devices of %d", jax.process_index(),
                     jax.process_count(), jax.local_device_count(), jax.device_count())


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
    from scale_ablation import experiment

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
