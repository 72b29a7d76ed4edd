"""`train(config, workdir)`: one language-model run around a pure, jitted train step.

The NNX functional style: the model is split once into (graphdef, params, rest) and merged
inside the jitted step, so the whole train state is a plain pytree that checkpoints, shards and
vmaps. `rest` holds non-trained state such as each layer's `ScaleValue`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from scale_ablation import data as data_lib
from scale_ablation import diagnostics, runtime, sharding, tracking
from scale_ablation.checkpoints import CheckpointError, Checkpoints
from scale_ablation.model import build_model

TrainState = dict[str, Any]  # {"params", "rest", "opt_state", "step", "lr"}

# Fields that define what is trained on what: a resumed run must not change them.
IDENTITY_FIELDS = ("policy", "layer_policies", "model", "data", "train.seed", "train.batch_size",
                   "train.dtype")


class ConfigError(ValueError):
    """User error in the config or workdir, reported as one line before anything is written."""


# --------------------------------------------------------------------------- optimiser


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """What the optimiser's program depends on (the peak learning rate is not: it is traced)."""

    steps: int
    warmup_steps: int
    grad_clip: float
    weight_decay: float

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> OptimizerSettings:
        t = config.train
        return cls(t.steps, t.warmup_steps, float(t.grad_clip), float(t.weight_decay))


def lr_multiplier(config: ml_collections.ConfigDict | OptimizerSettings) -> optax.Schedule:
    """Linear warmup to 1, then cosine decay to 0.1 at the last step."""
    settings = config if isinstance(config, OptimizerSettings) else OptimizerSettings.of(config)
    steps, warmup = settings.steps, settings.warmup_steps
    cosine = optax.cosine_decay_schedule(1.0, max(steps - warmup, 1), alpha=0.1)
    if warmup <= 0:
        return cosine
    return optax.join_schedules([optax.linear_schedule(0.0, 1.0, warmup), cosine], [warmup])


def make_optimizer(
    config: ml_collections.ConfigDict | OptimizerSettings,
) -> optax.GradientTransformation:
    """AdamW with clipping and the schedule; the peak learning rate is applied outside, from
    the state, so that runs differing only in lr share one compiled program (and vmap)."""
    settings = config if isinstance(config, OptimizerSettings) else OptimizerSettings.of(config)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    schedule = lr_multiplier(settings)
    parts = [
        optax.scale_by_adam(b1=0.9, b2=0.95, eps=1e-8),
        optax.add_decayed_weights(settings.weight_decay, mask=decay_mask),
        optax.scale_by_schedule(lambda count: -schedule(count)),
    ]
    if settings.grad_clip > 0:
        parts.insert(0, optax.clip_by_global_norm(settings.grad_clip))
    return optax.chain(*parts)


# --------------------------------------------------------------------------- pure steps


def cross_entropy(logits, targets, weights, z_loss: float):
    """Weighted mean next-byte loss (nats) plus z_loss·mean(log Z²)."""
    log_z = jax.nn.logsumexp(logits, axis=-1)  # (B, T)
    nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    total_weight = jnp.maximum(weights.sum(), 1.0)
    loss = (nll * weights).sum() / total_weight
    return loss, loss + z_loss * ((log_z**2) * weights).sum() / total_weight


def make_train_step(graphdef, tx: optax.GradientTransformation, z_loss: float):
    """(state, batch, dropout_key) -> (state, metrics), pure. A non-finite loss or gradient
    leaves the state untouched, so a diverged run (or ensemble member) keeps its last good
    parameters and its neighbours in a vmapped ensemble are unaffected."""

    def train_step(state: TrainState, batch: dict, dropout_key):
        def loss_fn(params):
            model = nnx.merge(graphdef, params, state["rest"])
            logits, _ = model(batch["inputs"], dropout_key=dropout_key)
            return cross_entropy(logits, batch["targets"], batch["weights"], z_loss)[::-1]

        (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        updates = jax.tree.map(lambda u: u * state["lr"], updates)
        params = optax.apply_updates(state["params"], updates)
        grad_norm = optax.global_norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new_state = {**state, "params": params, "opt_state": opt_state, "step": state["step"] + 1}
        new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
        metrics = {
            "train/loss": loss,
            "train/grad_norm": grad_norm,
            "train/update_norm": optax.global_norm(updates),
            "train/param_norm": optax.global_norm(params),
            "train/finite": finite,
        }
        return new_state, metrics

    return train_step


# One set of jitted steps per (graphdef, optimiser settings, z_loss), kept for the process.
_COMPILED: dict[tuple, tuple] = {}


def compiled_steps(graphdef, settings: OptimizerSettings, z_loss: float) -> tuple:
    """Jitted (train, eval, diagnostics) steps for a model structure and optimiser.

    Shared so that runs in one process (a sweep) with the same graphdef, such as every scalar
    policy at one d_k, or runs differing only in seed or learning rate, reuse one program.
    """
    key = (graphdef, settings, z_loss)
    if key not in _COMPILED:
        train_step = make_train_step(graphdef, make_optimizer(settings), z_loss)
        _COMPILED[key] = (jax.jit(train_step, donate_argnums=0),
                          jax.jit(make_eval_step(graphdef)),
                          jax.jit(make_diagnostics_step(graphdef)))
    return _COMPILED[key]


def train_step_compilations() -> int:
    """Programs compiled so far by the shared train steps of this process."""
    return sum(steps[0]._cache_size() for steps in _COMPILED.values())


def make_eval_step(graphdef):
    """(state, batch) -> summed loss, weight and correct predictions over the batch."""

    def eval_step(state: TrainState, batch: dict):
        model = nnx.merge(graphdef, state["params"], state["rest"])
        logits, _ = model(batch["inputs"])
        weights = batch["weights"]
        loss, _ = cross_entropy(logits, batch["targets"], weights, 0.0)
        correct = ((logits.argmax(-1) == batch["targets"]) * weights).sum()
        return loss * weights.sum(), weights.sum(), correct

    return eval_step


def make_diagnostics_step(graphdef):
    """(state, batch) -> flat per-layer attention statistics from the reference path."""

    def diagnostics_step(state: TrainState, batch: dict):
        model = nnx.merge(graphdef, state["params"], state["rest"])
        _, layer_stats = model(batch["inputs"], with_diagnostics=True)
        out = {}
        for index, stats in enumerate(layer_stats):
            out.update(diagnostics.summarise_layer(stats, f"attn/layer{index}"))
        return out

    return diagnostics_step


# --------------------------------------------------------------------------- setup


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming the first bad field."""
    t, d, m = config.train, config.data, config.model
    if t.lr <= 0 or not math.isfinite(t.lr):
        raise ValueError(f"train.lr must be positive, got {t.lr}")
    if t.steps <= 0:
        raise ValueError(f"train.steps must be positive, got {t.steps}")
    if t.batch_size <= 0 or t.batch_size % jax.device_count():
        raise ValueError(f"train.batch_size={t.batch_size} must be a positive multiple of the "
                         f"{jax.device_count()} devices")
    if d.seq_len <= 0 or (m.positions == "learned" and d.seq_len > m.max_seq_len):
        raise ValueError(f"data.seq_len={d.seq_len} must be in 1..model.max_seq_len={m.max_seq_len}")
    for seq_len in t.get("eval_seq_lens", ()):
        if seq_len <= 0 or (m.positions == "learned" and seq_len > m.max_seq_len):
            raise ValueError(f"train.eval_seq_lens: {seq_len} must be in 1..model.max_seq_len="
                             f"{m.max_seq_len} with learned positions (rotary has no limit)")
    for field in ("log_every", "eval_every", "diag_every"):
        if t[field] < 0:
            raise ValueError(f"train.{field} must be >= 0, got {t[field]}")
    if config.checkpoint.every < 0:
        raise ValueError(f"checkpoint.every must be >= 0, got {config.checkpoint.every}")


def changed_identity_fields(old: dict, new: dict) -> list[str]:
    """Dotted names of the identity fields that differ between two config dicts."""

    def flatten(tree, prefix=""):
        if isinstance(tree, dict):
            out = {}
            for key, value in tree.items():
                out.update(flatten(value, f"{prefix}{key}."))
            return out
        return {prefix[:-1]: tree}

    old_flat, new_flat = flatten(old), flatten(new)
    keys = sorted(set(old_flat) | set(new_flat))
    return [
        key for key in keys
        if any(key == f or key.startswith(f + ".") for f in IDENTITY_FIELDS)
        and _normalise(old_flat.get(key)) != _normalise(new_flat.get(key))
    ]


def _normalise(value):
    return list(value) if isinstance(value, tuple) else value


def _check_same_run(files: tracking.RunFiles, config: ml_collections.ConfigDict,
                    workdir: str) -> None:
    """Raise ConfigError if the run stored in `workdir` had different identity fields."""
    changed = changed_identity_fields(files.read_config() or {}, config.to_dict())
    if changed:
        raise ConfigError(f"workdir {workdir} holds a run with a different config: "
                          f"{', '.join(changed)} differ; use a new --workdir")


def init_state(config: ml_collections.ConfigDict, tx) -> tuple[Any, TrainState]:
    model = build_model(config, nnx.Rngs(params=config.train.seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = {
        "params": params,
        "rest": rest,
        "opt_state": tx.init(params),
        "step": jnp.zeros((), jnp.int32),
        "lr": jnp.asarray(config.train.lr, jnp.float32),
    }
    return graphdef, state


def to_device_batch(batch: data_lib.Batch, sharding: NamedSharding) -> dict:
    """Assemble the global batch from this process's rows (multi-host) and shard it."""
    return {
        name: jax.make_array_from_process_local_data(sharding, np.asarray(getattr(batch, name)))
        for name in ("inputs", "targets", "weights")
    }


class PreemptionFlag:
    """Turns SIGTERM/SIGINT into a flag the loop checks between steps."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Outside the main thread signals cannot be caught: leave them to the caller.
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_tags(config: ml_collections.ConfigDict) -> list[str]:
    return [*config.wandb.tags, f"policy={config.policy}", f"d_k={config.model.head_dim}"]


# --------------------------------------------------------------------------- the run


def dropout_key(seed: int | jax.Array, step: int | jax.Array) -> jax.Array:
    """The dropout key of `step`: a function of (seed, step) only, so that a resumed run, or an
    ensemble member (vmapped over `seed`), draws the masks its uninterrupted solo run draws."""
    return jax.random.fold_in(jax.random.key(seed + 1), step)


@dataclasses.dataclass
class Run:
    """A run ready to train: its state (restored when resuming), data and checkpoints."""

    config: ml_collections.ConfigDict
    workdir: str
    source: data_lib.DataSource
    graphdef: Any
    state: TrainState | None
    checkpoints: Checkpoints
    batch_sharding: NamedSharding
    previous: dict | None  # summary.json of an interrupted attempt
    resume_step: int | None


def set_up(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Run | dict:
    """The run in `workdir` ready to train, or the summary of a finished one.

    Raises ConfigError, before any file in `workdir` is touched, for bad config or workdir.
    """
    workdir = os.fspath(workdir)
    files = tracking.RunFiles(workdir)
    previous = files.read_summary() if os.path.isdir(workdir) else None
    if previous and previous.get("status") in ("completed", "diverged"):
        # A finished run is returned as it is, but only for the config that produced it.
        _check_same_run(files, config, workdir)
        return previous

    try:
        validate(config)
        mesh = sharding.make_mesh(config.train.get("fsdp", 1))
        source = data_lib.make_source(config.data, seed=config.train.seed)
        tx = make_optimizer(config)
        graphdef, state = init_state(config, tx)
        state = jax.device_put(state, sharding.state_shardings(state, mesh))
        checkpoints = Checkpoints(workdir, keep=config.checkpoint.keep)
        resume_step = checkpoints.latest_step()
        if resume_step is not None:
            _check_same_run(files, config, workdir)
            state = checkpoints.restore(resume_step, state)
            # The learning rate lives in the state (traced); a resumed run uses the config's,
            # so that config.json and the logged train/lr say what was used.
            state["lr"] = jax.device_put(jnp.asarray(config.train.lr, jnp.float32),
                                         state["lr"].sharding)
    except (ValueError, CheckpointError) as error:
        raise ConfigError(str(error)) from error
    return Run(config, workdir, source, graphdef, state, checkpoints,
               sharding.batch_sharding(mesh), previous, resume_step)


def open_tracker(run: Run) -> tracking.Tracker:
    """The run's files and W&B run (config.json written, metrics after a resume cut)."""
    return tracking.Tracker(
        run.workdir, run.config.to_dict(),
        {**run.config.wandb.to_dict(), "tags": run_tags(run.config)},
        resume_step=run.resume_step, enable=jax.process_index() == 0,
    )


def record_failure(tracker: tracking.Tracker, checkpoints: Checkpoints, error: Exception) -> None:
    """summary.json says `failed` and why; the W&B run and checkpoints are closed."""
    tracker.write_summary(status="failed", error=f"{type(error).__name__}: {error}")
    tracker.close(exit_code=1)
    checkpoints.close()


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict:
    """Train (or resume, or skip if already finished) the run in `workdir`; return its summary.

    Raises ConfigError, before any file in `workdir` is touched, for bad config or workdir.
    """
    run = set_up(config, workdir)
    if not isinstance(run, Run):
        return run
    tracker = open_tracker(run)
    try:
        summary = _loop(run, tracker)
    except Exception as error:
        record_failure(tracker, run.checkpoints, error)
        raise
    tracker.close(exit_code=0)
    run.checkpoints.close()
    return summary


def _loop(run: Run, tracker: tracking.Tracker) -> dict:
    t = run.config.train
    train_step, _, _ = compiled_steps(run.graphdef, OptimizerSettings.of(run.config),
                                      float(t.z_loss))
    recorder = Recorder(run, tracker)
    state, run.state = run.state, None  # donated by the first step: keep no stale reference
    recorder.begin(state)
    signal_at = _signal_at()  # SCALE_ABLATION_SIGNAL_AT test hook
    with PreemptionFlag() as preemption:
        for step in range(recorder.start_step, t.steps):
            # Every process of a multi-host run stops at the same step (runtime.agreed_signal).
            if (signum := runtime.agreed_signal(preemption.signal)) is not None:
                return recorder.preempt(step, state, signum)
            step_started = time.perf_counter()
            batch = to_device_batch(recorder.train_batch(step), run.batch_sharding)
            state, metrics = train_step(state, batch, dropout_key(t.seed, step))
            metrics = jax.device_get(metrics)
            summary = recorder.record(step, metrics, time.perf_counter() - step_started,
                                      lambda: state)  # noqa: B023 (called before `state` moves on)
            if summary is not None:
                return summary
            if signal_at and step + 1 == signal_at[0]:  # SCALE_ABLATION_SIGNAL_AT test hook
                os.kill(os.getpid(), signal_at[1])
    return recorder.complete(state)


def _signal_at() -> tuple[int, int] | None:
    """SCALE_ABLATION_SIGNAL_AT=STEP[:SIGNAME] (tests): after step STEP completes (row logged,
    checkpoint if due written) the process sends itself SIGNAME (default SIGTERM), so that a
    test interrupts a run at a known step instead of racing a signal against the clock."""
    spec = os.environ.get("SCALE_ABLATION_SIGNAL_AT")
    if not spec:
        return None
    step, _, name = spec.partition(":")
    return int(step), signal.Signals[name or "SIGTERM"]


class Recorder:
    """Everything a run does around its train step: evaluation, diagnostics, logging, progress,
    checkpoints and the summary. `train` steps one state; `scale_ablation.ensemble` steps many
    runs' states as one stacked state and hands each run's Recorder its own slice."""

    def __init__(self, run: Run, tracker: tracking.Tracker, label: str = ""):
        self.config, self.tracker, self.checkpoints = run.config, tracker, run.checkpoints
        self.source, self.label = run.source, label  # label: a prefix for printed lines
        t = run.config.train
        _, self._eval_step, self._diagnostics_step = compiled_steps(
            run.graphdef, OptimizerSettings.of(run.config), float(t.z_loss))
        self.val_batches = self._validation_set(run, run.config.data.seq_len)
        # Longer validation sequences, for length generalisation: `val/loss@LEN`.
        self.longer_val = {n: self._validation_set(run, n) for n in t.get("eval_seq_lens", ())}
        self.schedule = lr_multiplier(run.config)
        self.tokens_per_step = t.batch_size * run.config.data.seq_len
        self.start_step = int(run.state["step"])
        self.wall_before = (run.previous or {}).get("wall_seconds", 0.0) or 0.0
        self.started = time.perf_counter()
        self.timed_steps, self.timed_seconds = 0, 0.0
        self.last = {"train/loss": None, "val/loss": None, "val/bpb": None}

    def _validation_set(self, run: Run, seq_len: int) -> list[dict]:
        batches = self.source.val_batches(self.config.train.batch_size, seq_len,
                                          self.config.data.val_batches)
        return [to_device_batch(b, run.batch_sharding) for b in batches]

    def train_batch(self, step: int) -> data_lib.Batch:
        """This process's rows of the run's batch for `step`, on the host."""
        return self.source.train_batch(step, self.config.train.batch_size,
                                       self.config.data.seq_len,
                                       process_index=jax.process_index(),
                                       process_count=jax.process_count())

    def _mean_loss(self, state: TrainState, batches) -> tuple[float, float]:
        totals = np.zeros(3)  # summed loss, weight, correct predictions
        for batch in batches:
            totals += np.asarray(jax.device_get(self._eval_step(state, batch)), dtype=np.float64)
        return totals[0] / totals[1], totals[2] / totals[1]

    def _evaluate(self, state: TrainState) -> dict[str, float]:
        loss, accuracy = self._mean_loss(state, self.val_batches)
        self.last.update({"val/loss": loss, "val/bpb": loss / math.log(2)})
        row = {"val/loss": loss, "val/bpb": loss / math.log(2), "val/accuracy": accuracy}
        for seq_len, batches in self.longer_val.items():
            loss, accuracy = self._mean_loss(state, batches)
            row.update({f"val/loss@{seq_len}": loss, f"val/bpb@{seq_len}": loss / math.log(2),
                        f"val/accuracy@{seq_len}": accuracy})
        return row

    def _diagnose(self, state: TrainState) -> dict[str, float]:
        return _floats(jax.device_get(self._diagnostics_step(state, self.val_batches[0])))

    def _finish(self, status: str, step: int, **extra) -> dict:
        summary = {
            "status": status,
            "steps_completed": step,
            "final_train_loss": self.last["train/loss"],
            "final_val_loss": self.last["val/loss"],
            "final_val_bpb": self.last["val/bpb"],
            "diverged_at_step": None,
            "wall_seconds": self.wall_before + time.perf_counter() - self.started,
            "tokens_per_second": self.tokens_per_step * self.timed_steps / self.timed_seconds
            if self.timed_seconds else None,
            **extra,
        }
        self.tracker.write_summary(**summary)
        # Field for field what summary.json holds, so that rerunning a finished run (which
        # returns summary.json) gives back an equal dict.
        return {**dict.fromkeys(tracking.SUMMARY_FIELDS), **summary,
                "wandb_run_id": self.tracker.wandb.run_id}

    def begin(self, state: TrainState) -> None:
        t = self.config.train
        if self.start_step == 0 and (t.eval_every or t.diag_every):
            # The model at initialisation: the reference for LR sensitivity and for how far
            # training moves the attention statistics.
            self.tracker.log(0, {**(self._evaluate(state) if t.eval_every else {}),
                                 **(self._diagnose(state) if t.diag_every else {})})

    def record(self, step: int, metrics: dict, step_seconds: float,
               state: Callable[[], TrainState]) -> dict | None:
        """Logs what `step` is due to log, given its train metrics; returns the summary if the
        run diverged. `state` gives the state after the step, only when it is needed."""
        t = self.config.train
        state = functools.cache(state)  # an ensemble member's slice: cut at most once
        done = step + 1
        if step > self.start_step:  # the first step of a process includes compilation
            self.timed_steps, self.timed_seconds = (self.timed_steps + 1,
                                                    self.timed_seconds + step_seconds)
        if not metrics.pop("train/finite"):
            self.tracker.log(done, {**_floats(metrics), "train/diverged": 1.0})
            print(f"{self.label}step {done}: non-finite loss or gradient norm, run diverged",
                  flush=True)
            return self._finish("diverged", step, diverged_at_step=done)
        self.last["train/loss"] = float(metrics["train/loss"])
        row = {}
        if _due(t.log_every, done, t.steps):
            row.update(_floats(metrics))
            row["train/bpb"] = row["train/loss"] / math.log(2)
            row["train/lr"] = float(t.lr * self.schedule(step))
            row["perf/step_seconds"] = step_seconds
            if self.timed_seconds:
                row["perf/tokens_per_second"] = (self.tokens_per_step * self.timed_steps
                                                 / self.timed_seconds)
        if _due(t.eval_every, done, t.steps) or done == t.steps:  # summaries need a final eval
            row.update(self._evaluate(state()))
        if _due(t.diag_every, done, t.steps):
            row.update(self._diagnose(state()))
        if row:
            self.tracker.log(done, row)
        if t.log_every and done % t.log_every == 0:
            _progress(self.label, done, t.steps, row, self.timed_steps, self.timed_seconds,
                      self.tokens_per_step)
        if self.config.checkpoint.every and done % self.config.checkpoint.every == 0:
            self.checkpoints.save(done, state())
        return None

    def preempt(self, step: int, state: TrainState, signum: int) -> dict:
        """Checkpoint `state` (before `step`) and record the run as preempted."""
        self.checkpoints.save(step, state)
        return self._finish("preempted", step, signal=signal.Signals(signum).name)

    def complete(self, state: TrainState) -> dict:
        t = self.config.train
        if self.start_step >= t.steps:
            # Killed after the final checkpoint but before summary.json: no step ran here, so
            # the final train loss comes from the log and the restored parameters are
            # evaluated again.
            final_rows = [row for row in self.tracker.files.read_metrics()
                          if row["step"] == t.steps]
            self.last["train/loss"] = next(
                (row["train/loss"] for row in final_rows if "train/loss" in row), None
            )
            self._evaluate(state)
        self.checkpoints.save(t.steps, state)
        return self._finish("completed", t.steps)


def _due(every: int, done: int, total: int) -> bool:
    """Every `every` steps and at the last step; never when `every` is 0."""
    return bool(every) and (done % every == 0 or done == total)


def _floats(metrics: dict) -> dict[str, float]:
    return {key: float(value) for key, value in metrics.items()}


def _progress(label, step, total, row, timed_steps, timed_seconds, tokens_per_step) -> None:
    seconds_per_step = timed_seconds / timed_steps if timed_steps else float("nan")
    eta = (total - step) * seconds_per_step
    text = f"{label}step {step}/{total}  loss {row.get('train/loss', float('nan')):.4f}"
    if "val/loss" in row:
        text += f"  val {row['val/loss']:.4f}"
    text += f"  {tokens_per_step / seconds_per_step:,.0f} tok/s  eta {eta:.0f}s"
    print(text, flush=True)
