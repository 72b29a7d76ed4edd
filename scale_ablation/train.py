"""`train(config, workdir)`: one language-model run around a pure, jitted train step.

The NNX functional style: the model is split once into (graphdef, params, rest) and merged
inside the jitted step, so the whole train state is a plain pytree that checkpoints, shards and
vmaps. `rest` holds non-trained state such as each layer's `ScaleValue`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from scale_ablation import data as data_lib
from scale_ablation import diagnostics, sharding, tracking
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


class _PreemptionFlag:
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


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict:
    """Train (or resume, or skip if already finished) the run in `workdir`; return its summary.

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
    batch_sharding = sharding.batch_sharding(mesh)

    is_writer = jax.process_index() == 0
    tracker = tracking.Tracker(
        workdir, config.to_dict(),
        {**config.wandb.to_dict(), "tags": run_tags(config)},
        resume_step=resume_step, enable=is_writer,
    )
    try:
        summary = _loop(config, workdir, source, graphdef, state, checkpoints, tracker,
                        batch_sharding, previous)
    except Exception as error:
        tracker.write_summary(status="failed", error=f"{type(error).__name__}: {error}")
        tracker.close(exit_code=1)
        checkpoints.close()
        raise
    tracker.close(exit_code=0)
    checkpoints.close()
    return summary


def _loop(config, workdir, source, graphdef, state, checkpoints, tracker, batch_sharding,
          previous) -> dict:
    t = config.train
    train_step, eval_step, diagnostics_step = compiled_steps(
        graphdef, OptimizerSettings.of(config), float(t.z_loss))
    def validation_set(seq_len):
        return [to_device_batch(b, batch_sharding)
                for b in source.val_batches(t.batch_size, seq_len, config.data.val_batches)]

    val_batches = validation_set(config.data.seq_len)
    # Longer validation sequences, for length generalisation: `val/loss@LEN`.
    longer_val = {n: validation_set(n) for n in t.get("eval_seq_lens", ())}
    schedule = lr_multiplier(config)
    dropout_root = jax.random.key(t.seed + 1)
    tokens_per_step = t.batch_size * config.data.seq_len
    start_step = int(state["step"])
    wall_before = (previous or {}).get("wall_seconds", 0.0) or 0.0
    started = time.perf_counter()
    timed_steps, timed_seconds = 0, 0.0
    last = {"train/loss": None, "val/loss": None, "val/bpb": None}

    def mean_loss(batches) -> tuple[float, float]:
        totals = np.zeros(3)  # summed loss, weight, correct predictions
        for batch in batches:
            totals += np.asarray(jax.device_get(eval_step(state, batch)), dtype=np.float64)
        return totals[0] / totals[1], totals[2] / totals[1]

    def evaluate() -> dict[str, float]:
        loss, accuracy = mean_loss(val_batches)
        last.update({"val/loss": loss, "val/bpb": loss / math.log(2)})
        row = {"val/loss": loss, "val/bpb": loss / math.log(2), "val/accuracy": accuracy}
        for seq_len, batches in longer_val.items():
            loss, accuracy = mean_loss(batches)
            row.update({f"val/loss@{seq_len}": loss, f"val/bpb@{seq_len}": loss / math.log(2),
                        f"val/accuracy@{seq_len}": accuracy})
        return row

    def diagnose() -> dict[str, float]:
        return _floats(jax.device_get(diagnostics_step(state, val_batches[0])))

    def finish(status: str, step: int, **extra) -> dict:
        summary = {
            "status": status,
            "steps_completed": step,
            "final_train_loss": last["train/loss"],
            "final_val_loss": last["val/loss"],
            "final_val_bpb": last["val/bpb"],
            "diverged_at_step": None,
            "wall_seconds": wall_before + time.perf_counter() - started,
            "tokens_per_second": tokens_per_step * timed_steps / timed_seconds
            if timed_seconds else None,
            **extra,
        }
        tracker.write_summary(**summary)
        # Field for field what summary.json holds, so that rerunning a finished run (which
        # returns summary.json) gives back an equal dict.
        return {**dict.fromkeys(tracking.SUMMARY_FIELDS), **summary,
                "wandb_run_id": tracker.wandb.run_id}

    if start_step == 0 and (t.eval_every or t.diag_every):
        # The model at initialisation: the reference for LR sensitivity and for how far
        # training moves the attention statistics.
        tracker.log(0, {**(evaluate() if t.eval_every else {}),
                        **(diagnose() if t.diag_every else {})})
    with _PreemptionFlag() as preemption:
        for step in range(start_step, t.steps):
            if preemption.signal is not None:
                checkpoints.save(step, state)
                return finish("preempted", step, signal=signal.Signals(preemption.signal).name)
            step_started = time.perf_counter()
            batch = to_device_batch(
                source.train_batch(step, t.batch_size, config.data.seq_len,
                                   process_index=jax.process_index(),
                                   process_count=jax.process_count()),
                batch_sharding,
            )
            state, metrics = train_step(state, batch, jax.random.fold_in(dropout_root, step))
            metrics = jax.device_get(metrics)
            step_seconds = time.perf_counter() - step_started
            done = step + 1
            if step > start_step:  # the first step of a process includes compilation
                timed_steps, timed_seconds = timed_steps + 1, timed_seconds + step_seconds
            if not metrics.pop("train/finite"):
                tracker.log(done, {**_floats(metrics), "train/diverged": 1.0})
                print(f"step {done}: non-finite loss or gradient norm, run diverged", flush=True)
                return finish("diverged", step, diverged_at_step=done)
            last["train/loss"] = float(metrics["train/loss"])
            row = {}
            if _due(t.log_every, done, t.steps):
                row.update(_floats(metrics))
                row["train/bpb"] = row["train/loss"] / math.log(2)
                row["train/lr"] = float(t.lr * schedule(step))
                row["perf/step_seconds"] = step_seconds
                if timed_seconds:
                    row["perf/tokens_per_second"] = tokens_per_step * timed_steps / timed_seconds
            if _due(t.eval_every, done, t.steps) or done == t.steps:  # summaries need a final eval
                row.update(evaluate())
            if _due(t.diag_every, done, t.steps):
                row.update(diagnose())
            if row:
                tracker.log(done, row)
            if t.log_every and done % t.log_every == 0:
                _progress(done, t.steps, row, timed_steps, timed_seconds, tokens_per_step)
            if config.checkpoint.every and done % config.checkpoint.every == 0:
                checkpoints.save(done, state)
    if start_step >= t.steps:
        # Killed after the final checkpoint but before summary.json: no step ran here, so the
        # final train loss comes from the log and the restored parameters are evaluated again.
        final_rows = [row for row in tracker.files.read_metrics() if row["step"] == t.steps]
        last["train/loss"] = next(
            (row["train/loss"] for row in final_rows if "train/loss" in row), None
        )
        evaluate()
    checkpoints.save(t.steps, state)
    return finish("completed", t.steps)


def _due(every: int, done: int, total: int) -> bool:
    """Every `every` steps and at the last step; never when `every` is 0."""
    return bool(every) and (done % every == 0 or done == total)


def _floats(metrics: dict) -> dict[str, float]:
    return {key: float(value) for key, value in metrics.items()}


def _progress(step, total, row, timed_steps, timed_seconds, tokens_per_step) -> None:
    seconds_per_step = timed_seconds / timed_steps if timed_steps else float("nan")
    eta = (total - step) * seconds_per_step
    text = f"step {step}/{total}  loss {row.get('train/loss', float('nan')):.4f}"
    if "val/loss" in row:
        text += f"  val {row['val/loss']:.4f}"
    text += f"  {tokens_per_step / seconds_per_step:,.0f} tok/s  eta {eta:.0f}s"
    print(text, flush=True)
