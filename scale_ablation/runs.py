"""A run directory made ready to train: config checked, state built or restored, data opened.

`prepare` touches nothing on disk: every refusal (bad config, a workdir holding another run, an
unreadable checkpoint) is a `ConfigError` before the first write.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from scale_ablation import data as data_lib
from scale_ablation import sharding
from scale_ablation.checkpoints import CheckpointError, Checkpoints
from scale_ablation.config import ConfigError, ModelConfig, changed_identity_fields, validate
from scale_ablation.model import build_model
from scale_ablation.optim import OptimizerSettings, make_optimizer
from scale_ablation.run_files import FINISHED, RunFiles
from scale_ablation.steps import TrainState


@dataclasses.dataclass
class PreparedRun:
    """A run ready to train: its state (restored when resuming), data and checkpoints."""

    config: ml_collections.ConfigDict
    workdir: str
    source: data_lib.DataSource
    graphdef: Any
    state: TrainState | None  # None once the loop has taken it
    checkpoints: Checkpoints
    batch_sharding: NamedSharding
    previous: dict | None  # summary.json of an interrupted attempt
    resume_step: int | None

    @property
    def optimizer(self) -> OptimizerSettings:
        return OptimizerSettings.of(self.config)

    def take_state(self) -> TrainState:
        """The state, handed over once: the loop donates it to the first step."""
        state, self.state = self.state, None
        return state


def init_state(config: ml_collections.ConfigDict, tx=None) -> tuple[Any, TrainState]:
    """(graphdef, state) of a fresh run: parameters from `train.seed`, optimiser state, step 0."""
    model = build_model(ModelConfig.from_config(config), nnx.Rngs(params=config.train.seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = tx or make_optimizer(config)
    state = {
        "params": params,
        "rest": rest,
        "opt_state": tx.init(params),
        "step": jnp.zeros((), jnp.int32),
        "lr": jnp.asarray(config.train.lr, jnp.float32),
    }
    return graphdef, state


def check_same_run(workdir: str | os.PathLike, config: ml_collections.ConfigDict) -> None:
    """Raise ConfigError if `workdir` holds a run whose identity fields differ from `config`'s."""
    changed = changed_identity_fields(RunFiles(workdir).read_config() or {}, config.to_dict())
    if changed:
        raise ConfigError(f"workdir {os.fspath(workdir)} holds a run with a different config: "
                          f"{', '.join(changed)} differ; use a new --workdir")


def finished_summary(config: ml_collections.ConfigDict,
                     workdir: str | os.PathLike) -> dict | None:
    """summary.json of a finished run in `workdir` (checked to be this config's), else None."""
    summary = RunFiles(workdir).read_summary() if os.path.isdir(workdir) else None
    if summary and summary.get("status") in FINISHED:
        check_same_run(workdir, config)
        return summary
    return None


def prepare(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> PreparedRun:
    """The unfinished run in `workdir` ready to train (restored from its latest checkpoint).

    Raises ConfigError, before any file in `workdir` is touched, for bad config or workdir.
    """
    workdir = os.fspath(workdir)
    validate(config)
    previous = RunFiles(workdir).read_summary() if os.path.isdir(workdir) else None
    try:
        mesh = sharding.make_mesh(config.train.get("fsdp", 1))
        source = data_lib.make_source(config.data, seed=config.train.seed)
        graphdef, state = init_state(config)
        state = jax.device_put(state, sharding.state_shardings(state, mesh))
        checkpoints = Checkpoints(workdir, keep=config.checkpoint.keep)
        resume_step = checkpoints.latest_step()
        if resume_step is not None:
            check_same_run(workdir, config)
            state = checkpoints.restore(resume_step, state)
            # The learning rate lives in the state (traced); a resumed run uses the config's,
            # so that config.json and the logged train/lr say what was used.
            state["lr"] = jax.device_put(jnp.asarray(config.train.lr, jnp.float32),
                                         state["lr"].sharding)
    except (ValueError, CheckpointError) as error:
        raise ConfigError(str(error)) from error
    return PreparedRun(config, workdir, source, graphdef, state, checkpoints,
                       sharding.batch_sharding(mesh), previous, resume_step)


def to_device_batch(batch: data_lib.Batch, batch_sharding: NamedSharding) -> dict:
    """Assemble the global batch from this process's rows (multi-host) and shard it."""
    return {
        name: jax.make_array_from_process_local_data(batch_sharding,
                                                     np.asarray(getattr(batch, name)))
        for name in ("inputs", "targets", "weights")
    }
