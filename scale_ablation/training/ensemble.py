"""Runs that differ only in a scalar policy's value, the seed or the learning rate, trained as
one program over their stacked states: `jax.vmap(train_step)` on accelerators, and on a CPU
the members stepped in turn, in place in the stacked state (`steps.over_members`).
This module says which runs may train together (`group`) and how their states, batches and
dropout keys line up on the member axis (`MemberAxis`); `scale_ablation.training.loop` steps them.

Every `policies.scalar` policy at one d_k builds the same graphdef (its number lives in the
model state), and the seed and learning rate are state too, so K such runs are one compiled
program whose arrays have a leading member axis. On an accelerator a small model leaves the
chip mostly idle and K members cost little more than one; on a 2-core CPU a step of K costs
about what K solo steps do (DESIGN.md), but the K runs still compile once and skip K-1 rounds
of dispatch and host work.

Each member stays an ordinary run: its own run directory with the files, W&B run and
checkpoints that it writes alone, the same numbers to float32 round-off (its
own batches and dropout keys), and it can later resume alone. A member that diverges is frozen
by the step's `where` (its state stops changing) and its numbers are no longer read.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from scale_ablation.data import sources as data_lib
from scale_ablation.records.checkpoints import CheckpointError, Checkpoints
from scale_ablation.training import run_setup, steps
from scale_ablation.training.run_config import validate
from scale_ablation.training.run_setup import PreparedRun
from scale_ablation.training.steps import TrainState

# What members may differ in; everything else (shapes, data, schedule, logging) they share.
MEMBER_FIELDS = ("policy", "layer_policies", "train.seed", "train.lr", "wandb")


def shared_config(config: ml_collections.ConfigDict) -> str:
    """The config without MEMBER_FIELDS, as canonical JSON: equal for runs of one ensemble."""
    shared = config.to_dict()
    for field in MEMBER_FIELDS:
        *parents, leaf = field.split(".")
        functools.reduce(dict.__getitem__, parents, shared).pop(leaf, None)
    return json.dumps(shared, sort_keys=True, default=str)


def ensemble_key(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
                 checked: run_setup.Checked | None = None, extend: bool = False) -> Hashable | None:
    """What runs of one ensemble share: the graphdef, the config but MEMBER_FIELDS, and the step
    they start from (0, or an interrupted run's latest checkpoint). None for a run that trains
    alone: a finished one, or one that `run_setup.prepare` will refuse (and say why). `checked`:
    what the caller established (the config's ModelConfig; its config.json if read); `extend`:
    as the run will be trained (a finished run extended trains on, with the others)."""
    try:
        if run_setup.finished_summary(config, workdir, extend=extend,
                                      stored=checked.stored if checked else None) is not None:
            return None
        model = validate(config) if checked is None else checked.model
        checkpoints = Checkpoints(workdir)
        try:
            start_step = checkpoints.latest_step() or 0
        finally:
            checkpoints.close()
    except (ValueError, CheckpointError, OSError):  # the run's own prepare() reports it
        return None
    # The graphdef `run_setup.init_state` builds, traced abstractly: no parameter is allocated.
    return run_setup.model_graphdef(model), shared_config(config), start_step


def group(configs: Sequence[ml_collections.ConfigDict],
          workdirs: Sequence[str | os.PathLike],
          checked: Sequence[run_setup.Checked | None] | None = None, extend: bool = False,
          ) -> list[list[int]]:
    """Indices of the runs to train together, groups in the order of their first run.
    `checked`: per run, what the caller established; `extend`: as they will train
    (`ensemble_key`)."""
    groups: dict[Hashable, list[int]] = {}
    for index, (config, workdir, known) in enumerate(zip(
            configs, workdirs, checked or [None] * len(configs), strict=True)):
        key = ensemble_key(config, workdir, known, extend)
        groups.setdefault(("alone", index) if key is None else key, []).append(index)
    return list(groups.values())


class EnsembleMismatchError(ValueError):
    """Prepared runs that cannot step as one program: another shape or config, or another
    start step (a member whose latest checkpoint was damaged restored an older one)."""


def check_one_ensemble(prepared: Sequence[PreparedRun]) -> None:
    """Raise EnsembleMismatchError unless the runs can step as one program from one step."""
    first = prepared[0]
    for run in prepared[1:]:
        if (run.graphdef != first.graphdef or shared_config(run.config) != shared_config(
                first.config) or int(run.state["step"]) != int(first.state["step"])):
            raise EnsembleMismatchError(
                f"{run.workdir} (step {int(run.state['step'])}) and {first.workdir} "
                f"(step {int(first.state['step'])}) cannot train as one ensemble")


# Stacking and taking members as one program each: leaf by leaf, op by op, they compiled one
# small program per leaf shape (about 30 per group of a sweep, `python -m benchmarks.run`).
@jax.jit
def _stacked(states: list[TrainState]) -> TrainState:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)  # every leaf (K, ...)


@jax.jit
def _member(state: TrainState, index: jax.Array) -> TrainState:
    return jax.tree.map(lambda leaf: leaf[index], state)  # (K, ...) -> (...)


# Where the state's one device is the host (a CPU process with one device), stacking and taking
# members are copies in host memory: NumPy makes them with nothing to compile. Jitted they were
# a compile per state shape each, 12% of the quick d_k sweep's XLA seconds (issue 56). Sharded
# states keep the programs, which place each leaf's shards.
def _on_host(state: TrainState) -> bool:
    return jax.device_count() == 1 and jax.default_backend() == "cpu" and all(
        isinstance(leaf, jax.Array) and not jax.dtypes.issubdtype(leaf.dtype,
                                                                  jax.dtypes.prng_key)
        for leaf in jax.tree.leaves(state))


def _stacked_on_host(states: list[TrainState]) -> TrainState:
    """`_stacked`, bit for bit, each leaf placed as its members' are (replicated on the one
    device, as the program's outputs are)."""
    return jax.tree.map(lambda *leaves: jax.device_put(
        np.stack([np.asarray(leaf) for leaf in leaves]), leaves[0].sharding), *states)


def _member_on_host(state: TrainState, index: int) -> TrainState:
    """`_member`, bit for bit. A copy: on a CPU `device_put` aliases the NumPy buffer, and a
    view would alias the stacked state, which the next step may donate."""
    return jax.tree.map(lambda leaf: jax.device_put(np.array(np.asarray(leaf)[index]),
                                                    leaf.sharding), state)


def _stack_batches(batches: Sequence[data_lib.Batch]) -> data_lib.Batch:
    """Batches stacked along a new leading axis (steps or members)."""
    return data_lib.Batch(*(np.stack([getattr(b, name) for b in batches])
                            for name in ("inputs", "targets", "weights")))


class MemberAxis:
    """How K runs line up in one program. K = 1: states, batches and seeds as a solo run has
    them, stepped by the plain train step. K > 1: every leaf gets a leading member axis and the
    step runs over it (`steps.over_members`)."""

    def __init__(self, prepared: Sequence[PreparedRun], donate: bool = True):
        first = prepared[0]
        self.count = len(prepared)
        self.seeds = [run.config.train.seed for run in prepared]
        # On the device once: the step derives each step's dropout key from it (`steps.seeded`).
        self._seeds = jnp.asarray(self.seeds[0] if self.count == 1 else self.seeds, jnp.int32)
        self.batch_size, self.seq_len = first.config.train.batch_size, first.config.data.seq_len
        self._programs = steps.programs(first.graphdef, first.optimizer,
                                        float(first.config.train.z_loss))
        # donate=False keeps each input state alive after its step (the pipelined loop).
        self._donate = donate
        self._step = self._programs.train_program(self.count, donate)
        # (K, B, T): each member's rows split over the devices as in its solo run.
        self.batch_sharding = (first.batch_sharding if self.count == 1 else NamedSharding(
            first.batch_sharding.mesh, P(None, *first.batch_sharding.spec)))

    def stack(self, states: Sequence[TrainState]) -> TrainState:
        if self.count == 1:
            return states[0]
        return (_stacked_on_host if _on_host(states[0]) else _stacked)(list(states))

    def member_state(self, state: TrainState, index: int) -> TrainState:
        if self.count == 1:
            return state
        return (_member_on_host if _on_host(state) else _member)(state, index)

    def member_metrics(self, metrics: np.ndarray, index: int) -> dict[str, float]:
        """One member's named metrics from the step's (M,), or (K, M) for K > 1, on the host."""
        values = metrics if self.count == 1 else metrics[index]  # (M,)
        return {name: float(value) for name, value in zip(steps.TRAIN_METRICS, values,
                                                            strict=True)}

    def batch(self, sources: Sequence[data_lib.DataSource], step: int, count: int = 1) -> dict:
        """Each member's batches of steps `step`, ..., `step + count - 1` (this process's rows),
        on the devices: (B, T) for one step, (count, B, T) for several; (K, ...) for K > 1."""

        def member_rows(source: data_lib.DataSource) -> data_lib.Batch:
            rows = [source.train_batch(s, self.batch_size, self.seq_len,
                                       process_index=jax.process_index(),
                                       process_count=jax.process_count())
                    for s in range(step, step + count)]
            return rows[0] if count == 1 else _stack_batches(rows)

        return self._on_devices([member_rows(source) for source in sources], count)

    def example_batch(self, count: int = 1) -> dict:
        """Batches of zeros shaped and placed as `batch(..., count)` places the members'."""
        shape = (self.batch_size, self.seq_len) if count == 1 else (
            count, self.batch_size, self.seq_len)
        zeros = data_lib.Batch(np.zeros(shape, np.int32), np.zeros(shape, np.int32),
                               np.zeros(shape, np.float32))
        return self._on_devices([zeros] * self.count, count)

    def _on_devices(self, rows: list[data_lib.Batch], count: int) -> dict:
        """The members' rows as one batch on the devices, each member's split over them as in
        its solo run."""
        sharding = self.batch_sharding
        if count > 1:  # the steps' axis, unsplit, in front of (B, T) and behind the members'
            sharding = NamedSharding(sharding.mesh, P(None, *sharding.spec))
        return run_setup.to_device_batch(rows[0] if self.count == 1 else _stack_batches(rows),
                                         sharding)

    def step(self, state: TrainState, batch: dict, count: int = 1) -> tuple[TrainState,
                                                                            jax.Array]:
        """Dispatch `count` steps of every member (`batch` from `batch(..., count)`): the new
        state and the metrics, (M,) or (K, M) for one step, (count, M) or (K, count, M) for
        several (`steps.chunked`, one program per count)."""
        return self._program(count)(state, batch, self._seeds)

    def compile_step(self, state: TrainState, count: int = 1) -> None:
        """Compile the program of `count` steps for this state without running it
        (`scale_ablation.sweeping.ahead`)."""
        self._program(count).lower(state, self.example_batch(count), self._seeds).compile()

    def _program(self, count: int) -> Callable:
        return (self._step if count == 1
                else self._programs.chunk_program(self.count, self._donate))
