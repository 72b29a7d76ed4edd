"""Multi-host start-up through JAX's own multi-controller runtime."""

from __future__ import annotations

import os

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
