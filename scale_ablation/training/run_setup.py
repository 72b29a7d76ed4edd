"""A run directory made ready to train: config checked, state built or restored, data opened.

`prepare` touches nothing on disk: every refusal (bad config, a workdir holding another run, an
unreadable checkpoint) is a `ConfigError` before the first write.

What a command has established about a run travels down as a `Checked`: the ModelConfig that
`run_config.validate` returned and the run's config.json as read once (`StoredConfig`), so that
the checks before the lock, under it, and on the finished path neither validate nor read again.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from scale_ablation.data import sources as data_lib
from scale_ablation.errors import ConfigError
from scale_ablation.model import policies
from scale_ablation.model.build import build_model
from scale_ablation.model.spec import ModelConfig
from scale_ablation.records.checkpoints import CheckpointError, Checkpoints
from scale_ablation.records.run_files import FINISHED, RunFiles
from scale_ablation.training import run_config, sharding
from scale_ablation.training.optim import OptimizerSettings, make_optimizer
from scale_ablation.training.run_config import SCHEDULE_FIELDS, changed_identity_fields, validate
from scale_ablation.training.steps import TrainState


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
    model: ModelConfig | None = None  # the config's, built once (None: built when asked)

    @property
    def optimizer(self) -> OptimizerSettings:
        return OptimizerSettings.of(self.config, self.model)

    def take_state(self) -> TrainState:
        """The state, handed over once: the loop donates it to the first step."""
        state, self.state = self.state, None
        return state


@dataclasses.dataclass(frozen=True)
class StoredConfig:
    """A run directory's config.json as read once (`config` None: there is none), with what
    identifies the file that was read, so that a later check (under the run's lock) reads it
    again only if another process replaced it since."""

    config: dict | None
    stamp: tuple | None

    @classmethod
    def read(cls, workdir: str | os.PathLike) -> StoredConfig:
        """The file now; ValueError naming it if it is damaged. Stamped before it is read: a
        file replaced in between looks changed to the next check, never unchanged."""
        stamp = _stamp(workdir)
        return cls(RunFiles(workdir).read_config() if stamp else None, stamp)

    def unchanged(self, workdir: str | os.PathLike) -> bool:
        return _stamp(workdir) == self.stamp


def _stamp(workdir: str | os.PathLike) -> tuple | None:
    try:
        found = os.stat(os.path.join(workdir, "config.json"))
    except (FileNotFoundError, NotADirectoryError):  # none there (check_workdir names a file)
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size  # written by rename: a new inode


def _fresh(stored: StoredConfig | None, workdir: str | os.PathLike) -> StoredConfig:
    """`stored` if config.json is still the file it read, else the file read now."""
    return stored if stored is not None and stored.unchanged(workdir) else StoredConfig.read(
        workdir)


@dataclasses.dataclass(frozen=True)
class Checked:
    """What a command has established about one run: its config's ModelConfig (the config
    validated) and, once read, its config.json."""

    model: ModelConfig
    stored: StoredConfig | None = None


def init_state(config: ml_collections.ConfigDict, tx=None,
               model: ModelConfig | None = None) -> tuple[Any, TrainState]:
    """(graphdef, state) of a fresh run: parameters from `train.seed`, optimiser state, step 0.

    One jitted program per model shape and optimiser builds the whole state (`_init_program`):
    the seed, the learning rate and each layer's scalar-policy number are its inputs, so every
    run of a sweep at one shape shares it. With an explicit `tx` the optimiser state is built
    outside it. `model`: the config's ModelConfig, if the caller has it.
    """
    model = run_config.model_config(config) if model is None else model
    settings = None if tx is not None else OptimizerSettings.of(config, model)
    program = _init_program(_init_key(model), model, settings)
    base_scales = np.asarray(model.base_scales(), np.float32)  # (layers,)
    state = program(jnp.asarray(config.train.seed, jnp.int32),
                    jnp.asarray(config.train.lr, jnp.float32), base_scales)
    if tx is not None:
        state["opt_state"] = tx.init(state["params"])
    return model_graphdef(model), state


def model_graphdef(model: ModelConfig) -> Any:
    """The graphdef of `model`, traced abstractly: no parameter is allocated."""
    abstract = nnx.eval_shape(lambda: build_model(model, nnx.Rngs(params=0)))
    return nnx.split(abstract, nnx.Param, ...)[0]


def _init_key(model: ModelConfig) -> tuple:
    """What the init program depends on: the model but the numbers of its scalar policies
    (equal `ScalePolicy`s without parameters initialise the same parameters; their numbers are
    inputs). A policy with parameters of its own keeps its spec: they may start from it."""
    layers = tuple(policy if policy.init_fn is _NO_POLICY_PARAMS else spec
                   for spec, policy in ((s, policies.get(s)) for s in model.layer_policies))
    return dataclasses.replace(model, layer_policies=()), layers


_NO_POLICY_PARAMS = policies.ScalePolicy.__dataclass_fields__["init_fn"].default
# XLA's algebraic simplifier folds a normal sample's √2 into the initialiser's std, which moves
# the last bit of some parameters: without it the program gives the eager, op-by-op init's
# parameters bit for bit (tests/test_init_program.py). It runs once per run: speed is moot.
_EAGER_ROUNDING = {"xla_disable_hlo_passes": "algsimp"}
_INIT_PROGRAMS: dict[tuple, Any] = {}
_INIT_LOCK = threading.Lock()


def _init_program(key: tuple, model: ModelConfig, settings: OptimizerSettings | None):
    """(seed, lr, base_scales (layers,)) -> state, compiled once per key from the first `model`
    of its key (the others differ only in the numbers it takes as inputs)."""
    with _INIT_LOCK:  # `scale_ablation.sweeping.ahead` builds programs in a thread of its own
        return _init_program_locked(key, model, settings)


def _init_program_locked(key: tuple, model: ModelConfig, settings: OptimizerSettings | None):
    if (key, settings) not in _INIT_PROGRAMS:
        tx = make_optimizer(settings) if settings is not None else None

        def init(seed, lr, base_scales):
            built = build_model(model, nnx.Rngs(params=jax.random.key(seed)))
            for block, scale in zip(built.blocks, base_scales, strict=True):
                block.attention.base_scale.set_value(scale)
            _, params, rest = nnx.split(built, nnx.Param, ...)
            return {"params": params, "rest": rest,
                    "opt_state": tx.init(params) if tx is not None else None,
                    "step": jnp.zeros((), jnp.int32), "lr": lr}

        args = (jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.float32),
                jax.ShapeDtypeStruct((model.num_layers,), jnp.float32))
        _INIT_PROGRAMS[(key, settings)] = jax.jit(init).lower(*args).compile(
            compiler_options=_EAGER_ROUNDING)
    return _INIT_PROGRAMS[(key, settings)]


def init_compilations() -> int:
    """Init programs compiled so far by this process (one per model shape and optimiser)."""
    return len(_INIT_PROGRAMS)


def check_same_run(workdir: str | os.PathLike, config: ml_collections.ConfigDict,
                   old: dict | None = None) -> None:
    """Raise ConfigError if `workdir` holds a run whose identity fields differ from `config`'s.
    `old`: its config.json as already read (else read here)."""
    old = RunFiles(workdir).read_config() if old is None else old
    changed = changed_identity_fields(old or {}, config.to_dict())
    if changed:
        raise ConfigError(f"workdir {os.fspath(workdir)} holds a run with a different config: "
                          f"{', '.join(changed)} differ; use a new --workdir")


def check_same_schedule(workdir: str | os.PathLike, config: ml_collections.ConfigDict,
                        trained_to: int, *, extend: bool, old: dict | None = None) -> None:
    """Raise ConfigError if the run in `workdir`, trained to step `trained_to`, had another
    schedule (`SCHEDULE_FIELDS`) and `extend` is off, or if an extension would end before
    `trained_to`. `old`: its config.json as already read (else read here)."""
    old = (RunFiles(workdir).read_config() if old is None else old) or {}
    changed = changed_identity_fields(old, config.to_dict(), SCHEDULE_FIELDS)
    if not changed:
        return
    if not extend:
        was = ", ".join(f"{field}={_lookup(old, field)} (now {_lookup(config.to_dict(), field)})"
                        for field in changed)
        raise ConfigError(f"workdir {os.fspath(workdir)} holds a run trained to step "
                          f"{trained_to} with {was}: pass --extend to continue it with the new "
                          "settings, or use a new --workdir")
    if config.train.steps < trained_to:
        raise ConfigError(f"--extend: train.steps={config.train.steps} is before step "
                          f"{trained_to}, which the run in {os.fspath(workdir)} has reached")


def _lookup(tree: dict, dotted: str) -> Any:
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def finished_summary(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                     extend: bool = False, stored: StoredConfig | None = None) -> dict | None:
    """summary.json of a finished run in `workdir` (checked to be this config's), else None.

    A finished run with another schedule is refused (ConfigError) unless `extend`, in which
    case it is no longer finished: None, and it trains on from its last checkpoint. `stored`:
    its config.json as already read (read here, once, if it is not, or if it changed since).
    """
    check_workdir(workdir)
    summary = read_summary(workdir)
    if summary and summary.get("status") in FINISHED:
        old = _fresh(stored, workdir).config or {}
        check_same_run(workdir, config, old)
        check_same_schedule(workdir, config, summary.get("steps_completed") or 0, extend=extend,
                            old=old)
        if not changed_identity_fields(old, config.to_dict(), SCHEDULE_FIELDS):
            try:
                RunFiles(workdir).read_result_metrics()
            except ValueError as error:  # repaired by recomputing from an intact checkpoint
                print(f"warning: {os.fspath(workdir)} finished, but {error}: its rows are "
                      "recomputed", file=sys.stderr, flush=True)
                return None
            return summary
    return None


# Kernel filesystems: writes there fail, or do something other than store a file.
VIRTUAL_FILESYSTEMS = ("/proc", "/sys", "/dev")


def check_workdir(workdir: str | os.PathLike) -> None:
    """Raise ConfigError, creating nothing, unless `workdir` is a directory or could be made
    one: its nearest existing ancestor a writable directory outside `VIRTUAL_FILESYSTEMS`."""
    workdir = os.fspath(workdir)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"--workdir {workdir} is a file, not a directory")
    real = os.path.realpath(workdir)
    if any(real == top or real.startswith(top + os.sep) for top in VIRTUAL_FILESYSTEMS):
        raise ConfigError(f"--workdir {workdir} is on a kernel filesystem ({real}), which "
                          "cannot hold run files: use a directory on a disk")
    ancestor = real
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ConfigError(f"--workdir {workdir} is under {ancestor}, a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"--workdir {workdir}: {ancestor} is not writable")


def read_summary(workdir: str | os.PathLike) -> dict | None:
    """The run's summary.json, None if none; ConfigError naming the file if it is damaged."""
    try:
        return RunFiles(workdir).read_summary() if os.path.isdir(workdir) else None
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_before_start(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                       extend: bool = False, checked: Checked | None = None) -> Checked:
    """Every refusal that needs no JAX computation: the config, the workdir, the identity of a
    run already there (config.json, checkpoint or not). Writes nothing, compiles nothing.

    Returns what it established (`Checked`), to hand to the next check of this run: given
    one, the config is not validated again and config.json is read only if it changed since.
    """
    model = validate(config) if checked is None else checked.model
    check_workdir(workdir)
    summary = read_summary(workdir)
    try:
        stored = _fresh(checked.stored if checked else None, workdir)
        if stored.stamp is not None:
            _check_same_run_data_first(workdir, config, stored.config)
            saved = checkpoint_steps(workdir)
            if saved:
                check_same_schedule(workdir, config, max(saved), extend=extend,
                                    old=stored.config)
            elif extend and summary and summary.get("status") in FINISHED:
                # Trained anew from step 0 on the longer schedule, it would replace its history.
                raise ConfigError(f"{os.fspath(workdir)} finished without a checkpoint "
                                  "(checkpoint.keep_final=false), so it cannot be extended: "
                                  "train it in a new --workdir")
        Checkpoints(workdir).check_some_intact(checkpoint_steps(workdir),
                                               RunFiles(workdir).scan_metrics())
    except ValueError as error:  # a damaged config.json or no intact checkpoint
        raise ConfigError(str(error)) from None
    return Checked(model, stored)


def _check_same_run_data_first(workdir: str, config: ml_collections.ConfigDict,
                               old: dict | None) -> None:
    """check_same_run; a changed data source that cannot be opened at all is named as that
    (the more useful line), which costs opening it only on this refusal path."""
    try:
        check_same_run(workdir, config, old or {})
    except ConfigError:
        data_lib.make_source(config.data, seed=config.train.seed)  # ValueError naming it
        raise


def checkpoint_steps(workdir: str | os.PathLike) -> list[int]:
    """The steps of `workdir/checkpoints/<step>/`, read from the names alone (no orbax).

    A `checkpoints` that exists but is no directory is refused (ConfigError): read as "no
    checkpoints" it would restart the run from step 0 and erase its metrics history.
    """
    directory = os.path.join(workdir, "checkpoints")
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise ConfigError(f"{directory} is not a directory (a run's checkpoints live there): "
                          "move it aside, or use a new --workdir")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return [int(name) for name in names if name.isdigit()]


def prepare(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
            extend: bool = False, checked: Checked | None = None) -> PreparedRun:
    """The unfinished run in `workdir` ready to train (restored from its newest intact
    checkpoint; damaged newer ones are moved aside with a warning). `checked`: what an earlier
    `check_before_start` of this run established (its checks are made again, on it).

    Raises ConfigError, before any file in `workdir` is touched, for bad config or workdir, a
    changed schedule without `extend`, or no intact checkpoint.
    """
    workdir = os.fspath(workdir)
    model = check_before_start(config, workdir, extend=extend, checked=checked).model
    previous = read_summary(workdir)
    try:
        mesh = sharding.make_mesh(config.train.get("fsdp", 1))
        source = data_lib.make_source(config.data, seed=config.train.seed)
        graphdef, state = init_state(config, model=model)
        state = jax.device_put(state, sharding.state_shardings(state, mesh))
        files = RunFiles(workdir)
        checkpoints = Checkpoints(workdir, keep=config.checkpoint.keep,
                                  rows_through=files.count_rows_through)
        resume_step, state = checkpoints.restore_newest_intact(state, files.scan_metrics())
        if resume_step is not None:
            # The learning rate lives in the state (traced); a resumed run uses the config's,
            # so that config.json and the logged train/lr say what was used.
            state["lr"] = jax.device_put(jnp.asarray(config.train.lr, jnp.float32),
                                         state["lr"].sharding)
    except (ValueError, CheckpointError) as error:
        raise ConfigError(str(error)) from error
    return PreparedRun(config, workdir, source, graphdef, state, checkpoints,
                       sharding.batch_sharding(mesh), previous, resume_step, model)


def to_device_batch(batch: data_lib.Batch, batch_sharding: NamedSharding) -> dict:
    """Assemble the global batch from this process's rows (multi-host) and shard it."""
    rows = {name: np.asarray(getattr(batch, name)) for name in ("inputs", "targets", "weights")}
    if jax.process_count() == 1:  # the rows are the global batch: one transfer call for all
        return jax.device_put(rows, batch_sharding)
    return {name: jax.make_array_from_process_local_data(batch_sharding, local)
            for name, local in rows.items()}
