"""Runs that differ only in a scalar policy's value, the seed or the learning rate, trained as
one program over their stacked states: `jax.vmap(train_step)` on accelerators, and on a CPU
`jax.lax.map(train_step)` (the members in turn inside one program; see `_over_members`).

Every `policies.scalar` policy at one d_k builds the same graphdef (its number lives in the
model state), and the seed and learning rate are state too, so K such runs are one compiled
program whose arrays have a leading member axis. On an accelerator a small model leaves the
chip mostly idle and K members cost little more than one; on a 2-core CPU a step of K costs
about what K solo steps do (DESIGN.md), but the K runs still compile once and skip K-1 rounds
of dispatch and host work.

Each member stays an ordinary run: its own run directory with the files, W&B run and
checkpoints that `train.train` writes for it alone, the same numbers to float32 round-off (its
own batches and dropout keys), and it can later resume alone. A member that diverges is frozen
by the step's `where` (its state stops changing) and its numbers are no longer read.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from scale_ablation import data as data_lib
from scale_ablation import tracking, train
from scale_ablation.checkpoints import Checkpoints

# What members may differ in; everything else (shapes, data, schedule, logging) they share.
MEMBER_FIELDS = ("policy", "layer_policies", "train.seed", "train.lr", "wandb")


def shared_config(config: ml_collections.ConfigDict) -> str:
    """The config without MEMBER_FIELDS, as canonical JSON: equal for runs of one ensemble."""
    shared = config.to_dict()
    for field in MEMBER_FIELDS:
        *parents, leaf = field.split(".")
        functools.reduce(dict.__getitem__, parents, shared).pop(leaf, None)
    return json.dumps(shared, sort_keys=True, default=str)


def _graphdef(config: ml_collections.ConfigDict):
    """The graphdef `train.init_state` builds, traced abstractly: no parameter is allocated."""
    graphdefs = []

    def init():
        graphdef, state = train.init_state(config, train.make_optimizer(config))
        graphdefs.append(graphdef)
        return state

    jax.eval_shape(init)
    return graphdefs[0]


def ensemble_key(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Hashable | None:
    """What runs of one ensemble share: the graphdef, the config but MEMBER_FIELDS, and the step
    they start from (0, or an interrupted run's latest checkpoint). None for a run that trains
    alone: a finished one, or one that `train.train` will refuse (and say why)."""
    try:
        train.validate(config)
        summary = tracking.RunFiles(workdir).read_summary() or {}
        if summary.get("status") in ("completed", "diverged"):
            return None
        checkpoints = Checkpoints(workdir)
        try:
            start_step = checkpoints.latest_step() or 0
        finally:
            checkpoints.close()
        graphdef = _graphdef(config)
    except Exception:  # whatever it is, the run's own train.train reports it
        return None
    return graphdef, shared_config(config), start_step


def group(configs: Sequence[ml_collections.ConfigDict],
          workdirs: Sequence[str | os.PathLike]) -> list[list[int]]:
    """Indices of the runs to train together, groups in the order of their first run."""
    groups: dict[Hashable, list[int]] = {}
    for index, (config, workdir) in enumerate(zip(configs, workdirs, strict=True)):
        key = ensemble_key(config, workdir)
        groups.setdefault(("alone", index) if key is None else key, []).append(index)
    return list(groups.values())


# One jitted ensemble step per (graphdef, optimiser settings, z_loss), kept for the process;
# jit compiles it once per member count K.
_COMPILED: dict[tuple, jax.stages.Wrapped] = {}


def compiled_ensemble_step(graphdef, settings: train.OptimizerSettings,
                           z_loss: float) -> jax.stages.Wrapped:
    """(states, batches, dropout_keys) -> (states, metrics), every leaf with a leading axis K."""
    key = (graphdef, settings, z_loss)
    if key not in _COMPILED:
        step = train.make_train_step(graphdef, train.make_optimizer(settings), z_loss)
        _COMPILED[key] = jax.jit(_over_members(step, jax.default_backend()), donate_argnums=0)
    return _COMPILED[key]


def _over_members(step, backend: str):
    """The step over a leading member axis. On a CPU the matmuls of one small model already
    keep the cores busy and vmap's batched matmuls ran slower than K solo steps (0.7x for 8
    tiny members, benchmarks/run.py `ensemble_detail`), while stepping the members in turn
    inside one program ran 1.1x faster; accelerators want the one wide vmapped program."""
    if backend == "cpu":
        return lambda states, batches, keys: jax.lax.map(lambda a: step(*a),
                                                         (states, batches, keys))
    return jax.vmap(step)


# Each member's key exactly as its solo run derives it: (K,) seeds, one step -> (K,) keys.
_dropout_keys = jax.jit(jax.vmap(train.dropout_key, in_axes=(0, None)))


def _stack(trees: Sequence) -> dict:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)  # every leaf (K, ...)


def _member(state: dict, index: int) -> train.TrainState:
    return jax.tree.map(lambda leaf: leaf[index], state)  # (K, ...) -> (...)


def _stack_batches(batches: Sequence[data_lib.Batch]) -> data_lib.Batch:
    names = ("inputs", "targets", "weights")
    return data_lib.Batch(**{n: np.stack([getattr(b, n) for b in batches]) for n in names})


def train_ensemble(configs: Sequence[ml_collections.ConfigDict],
                   workdirs: Sequence[str | os.PathLike],
                   labels: Sequence[str] | None = None) -> list[dict]:
    """Train unfinished runs that `group` put together; return their summaries in order.

    Raises ConfigError (train.set_up's), before any file is written, if a member is refused,
    and ValueError if the runs do not belong to one ensemble. `labels` prefix printed lines.
    """
    runs = [train.set_up(config, workdir) for config, workdir in zip(configs, workdirs,
                                                                       strict=True)]
    first = runs[0]
    for run in runs:
        if not isinstance(run, train.Run):
            raise ValueError("a finished run is no ensemble member: train.train returns it")
        if (run.graphdef != first.graphdef or shared_config(run.config) != shared_config(
                first.config) or int(run.state["step"]) != int(first.state["step"])):
            raise ValueError(f"{run.workdir} and {first.workdir} cannot train as one ensemble")
    labels = labels or [os.path.basename(run.workdir) for run in runs]
    summaries: list[dict | None] = [None] * len(runs)
    trackers, recorders = [], []
    try:
        for run, label in zip(runs, labels, strict=True):
            trackers.append(train.open_tracker(run))
            recorders.append(train.Recorder(run, trackers[-1], label=f"[{label}] "))
        _loop(runs, recorders, summaries)
    except Exception as error:  # as train.train: recorded as failed, then raised
        for run, tracker, summary in zip(runs, trackers, summaries, strict=False):
            if summary is None:
                train.record_failure(tracker, run.checkpoints, error)
        raise
    return summaries


def _loop(runs: list[train.Run], recorders: list[train.Recorder],
          summaries: list[dict | None]) -> None:
    """train._loop for K runs; fills `summaries` as members finish."""
    first, t = runs[0], runs[0].config.train
    ensemble_step = compiled_ensemble_step(first.graphdef, train.OptimizerSettings.of(first.config),
                                           float(t.z_loss))
    state = _stack([run.state for run in runs])
    for run in runs:
        run.state = None  # the stacked copy is the only one kept
    seeds = jnp.asarray([run.config.train.seed for run in runs])  # (K,)
    # (K, B, T): each member's rows split over the devices as in its solo run.
    batch_sharding = NamedSharding(first.batch_sharding.mesh,
                                   P(None, *first.batch_sharding.spec))
    active = list(range(len(runs)))

    def end(index: int, summary: dict) -> None:
        summaries[index] = summary
        recorders[index].tracker.close(exit_code=0)
        recorders[index].checkpoints.close()
        active.remove(index)

    for index, recorder in enumerate(recorders):
        recorder.begin(_member(state, index))
    with train.PreemptionFlag() as preemption:
        for step in range(recorders[0].start_step, t.steps):
            if preemption.signal is not None:
                for index in list(active):
                    end(index, recorders[index].preempt(step, _member(state, index),
                                                        preemption.signal))
                return
            step_started = time.perf_counter()
            batch = _stack_batches([recorder.train_batch(step) for recorder in recorders])
            batch = train.to_device_batch(batch, batch_sharding)  # (K, B, T)
            state, metrics = ensemble_step(state, batch, _dropout_keys(seeds, step))
            metrics = jax.device_get(metrics)  # every value (K,)
            # Each member is charged the whole ensemble's step: its own tokens per second.
            step_seconds = time.perf_counter() - step_started
            for index in list(active):
                summary = recorders[index].record(
                    step, {name: value[index] for name, value in metrics.items()}, step_seconds,
                    functools.partial(_member, state, index))
                if summary is not None:  # diverged: frozen from here on, its numbers unread
                    end(index, summary)
            if not active:
                return
    for index in list(active):
        end(index, recorders[index].complete(_member(state, index)))
