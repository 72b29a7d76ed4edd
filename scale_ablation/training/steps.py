"""The pure, jitted programs of a run: train step, evaluation and attention diagnostics.

The NNX functional style: the model is split once into (graphdef, params, rest) and merged
inside each program, so the whole train state is a plain pytree that checkpoints, shards and
stacks. `rest` holds non-trained state such as each layer's `ScaleValue`.

One cache of compiled programs serves every run of a process: runs with the same graphdef,
optimiser settings and z-loss (every scalar policy at one d_k, every seed and lr) share them,
alone or as members of one ensemble.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from scale_ablation.model import diagnostics, logit_sources, qk_clip
from scale_ablation.training import loss_scaling
from scale_ablation.training.loss_scaling import LossScaling
from scale_ablation.training.optim import OptimizerSettings, make_optimizer

TrainState = dict[str, Any]  # {"params", "rest", "opt_state", "step", "lr"}
# What a train step measures, in the order the loop's programs return it (`seeded`);
# `train/loss_scale`: the scale the step's loss was multiplied by (1 without loss scaling).
TRAIN_METRICS = ("train/loss", "train/grad_norm", "train/update_norm", "train/param_norm",
                 "train/finite", "train/loss_scale")


def token_nll(logits, targets):
    """Per-position next-byte loss (nats) and log Z, each (B, T)."""
    log_z = jax.nn.logsumexp(logits, axis=-1)  # (B, T)
    return log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0], log_z


def _z_term(log_z, weights, total_weight, z_loss: float):
    """z_loss·mean(log Z²) over the weighted positions (padding excluded)."""
    return z_loss * ((log_z**2) * weights).sum() / total_weight


def cross_entropy(logits, targets, weights, z_loss: float):
    """Weighted mean next-byte loss (nats) plus z_loss·mean(log Z²)."""
    nll, log_z = token_nll(logits, targets)
    total_weight = jnp.maximum(weights.sum(), 1.0)
    loss = (nll * weights).sum() / total_weight
    return loss, loss + _z_term(log_z, weights, total_weight, z_loss)


def make_loss(graphdef, z_loss: float, *, with_rest: bool = False) -> Callable:
    """(params, state, batch, dropout_key) -> (loss with z-loss, loss): what a train step
    differentiates with respect to `params` (`scale_ablation.nonfinite` replays it).
    with_rest: the aux is (loss, each QK-clip layer's largest logit per head in this forward
    pass), for `model.qk_clip.after_step`."""

    def loss_fn(params, state: TrainState, batch: dict, dropout_key):
        model = nnx.merge(graphdef, params, state["rest"])
        if with_rest:
            logits, maxima = qk_clip.forward(model, batch["inputs"], dropout_key)
        else:
            logits, _ = model(batch["inputs"], dropout_key=dropout_key)
        loss, with_z = cross_entropy(logits, batch["targets"], batch["weights"], z_loss)
        if with_rest:
            return with_z, (loss, maxima)
        return with_z, loss

    return loss_fn


def make_train_step(graphdef, tx: optax.GradientTransformation, z_loss: float,
                    scaling: LossScaling = loss_scaling.NONE):
    """(state, batch, dropout_key) -> (state, metrics), pure. A non-finite loss or gradient
    leaves the state untouched, so a diverged run (or ensemble member) keeps its last good
    parameters and its neighbours in a vmapped ensemble are unaffected.

    scaling: the loss scaling (`training.loss_scaling`; `tx` from `make_optimizer` of the same
    settings). Under a dynamic scale a non-finite gradient above its minimum is an overflow,
    not a divergence: the step is skipped (`tx` leaves the parameters and its state as they
    were), the counter moves on and the run stays healthy."""
    def train_step(state: TrainState, batch: dict, dropout_key):
        clips = qk_clip.applies(graphdef, state["params"], state["rest"])  # trace-time
        scale = loss_scaling.current_scale(scaling, state["opt_state"])
        loss_fn = loss_scaling.scaled(make_loss(graphdef, z_loss, with_rest=clips), scaling,
                                      scale)
        (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state["params"], state, batch, dropout_key)
        grads = loss_scaling.unscale(scaling, grads, scale)
        loss, maxima = aux if clips else (aux, None)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        updates = jax.tree.map(lambda u: u * state["lr"], updates)
        params = optax.apply_updates(state["params"], updates)
        rest = state["rest"]
        grad_norm = optax.tree.norm(grads)
        if clips:  # MuonClip: W_Q, W_K of heads whose largest logit exceeded T, after the update
            clipped = qk_clip.after_step(graphdef, params, rest, maxima)
            # A skipped step (dynamic loss scale) has no update to clip after.
            params, rest = clipped if not scaling.dynamic else jax.tree.map(
                lambda new, old: jnp.where(jnp.isfinite(grad_norm), new, old), clipped,
                (params, rest))
        finite = jnp.isfinite(loss) & (jnp.isfinite(grad_norm)
                                       | loss_scaling.may_skip(scaling, scale))
        new_state = {**state, "params": params, "rest": rest, "opt_state": opt_state,
                     "step": state["step"] + 1}
        new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
        metrics = {
            "train/loss": loss,
            "train/grad_norm": grad_norm,
            "train/update_norm": optax.tree.norm(updates),
            "train/param_norm": optax.tree.norm(params),
            "train/finite": finite,
            "train/loss_scale": scale,
        }
        return new_state, metrics

    return train_step



def make_eval_step(graphdef):
    """(state, batch) -> summed loss, weight and correct predictions per position, each (T,)
    summed over the batch: the caller averages over all positions or any range of them (the
    positions beyond the training length) from one program per sequence length."""

    def eval_step(state: TrainState, batch: dict):
        model = nnx.merge(graphdef, state["params"], state["rest"])
        logits, _ = model(batch["inputs"])
        weights = batch["weights"]
        nll, _ = token_nll(logits, batch["targets"])
        correct = ((logits.argmax(-1) == batch["targets"]) * weights).sum(0)
        return (nll * weights).sum(0), weights.sum(0), correct

    return eval_step


def z_loss_share(logits, targets, weights, z_loss: float) -> jax.Array:
    """The z-loss's share of the objective it is added to, z·mean(log² Z) / (loss + that): how
    much it acts (issue 54: an intervention that never acts cannot cost or help anything)."""
    nll, log_z = token_nll(logits, targets)
    total_weight = jnp.maximum(weights.sum(), 1.0)
    # The z term on its own, not with_z − loss: float32 would round a share of 1e-4 away.
    z_term = _z_term(log_z, weights, total_weight, z_loss)
    return z_term / ((nll * weights).sum() / total_weight + z_term)


def make_diagnostics_step(graphdef, z_loss: float = 0.0):
    """(state, batch) -> flat per-layer attention statistics from the reference path and, with
    a z-loss, its share of the objective on the batch (`diag/z_loss_share`)."""

    def diagnostics_step(state: TrainState, batch: dict):
        model = nnx.merge(graphdef, state["params"], state["rest"])
        logits, layer_stats = model(batch["inputs"], with_diagnostics=True)
        out = {}
        for index, stats in enumerate(layer_stats):
            out.update(diagnostics.summarise_layer(stats, f"attn/layer{index}"))
        if z_loss:
            out["diag/z_loss_share"] = z_loss_share(logits, batch["targets"], batch["weights"],
                                                    z_loss)
        return out

    return diagnostics_step


def dropout_key(seed: int | jax.Array, step: int | jax.Array) -> jax.Array:
    """The dropout key of `step`: a function of (seed, step) only, so that a resumed run, or an
    ensemble member (vmapped over `seed`), draws the masks its uninterrupted solo run draws."""
    return jax.random.fold_in(jax.random.key(seed + 1), step)


def seeded(step: Callable) -> Callable:
    """The loop's form of a train step: (state, batch, seed) -> (state, metrics (M,)), M =
    len(TRAIN_METRICS), float32 (`train/finite` as 0 or 1).

    Each exchange between host and device is a round trip through the driver. Deriving the
    dropout key on the device, from the seed and the state's step counter (the key the host's
    `dropout_key(seed, step)` makes), and returning the metrics as one vector leave one batch
    in and one vector out per step: on an H200 the loop's ~15 exchanges per step had left the
    device idle 72% of the time
    (benchmarks/results/gpu_check_NVIDIA_H200_2026-11-30_before.txt).
    """

    def train_step(state: TrainState, batch: dict, seed: jax.Array):
        new_state, metrics = step(state, batch, dropout_key(seed, state["step"]))
        return new_state, jnp.stack([metrics[name].astype(jnp.float32) for name in TRAIN_METRICS])

    return train_step


def chunked(step: Callable) -> Callable:
    """A `seeded` step run n times in one program, n the batches' leading axis:
    (state, batches (n, B, T), seed) -> (state, metrics (n, M)). After a non-finite step the
    rest of the chunk leaves the state as it is, as the loop does by stopping the run there.
    One dispatch for n steps: the host's cost of launching a step program (5.5 ms on an H200
    host, more than the benchmark config's 4 ms on the device) is paid once per chunk."""
    finite = TRAIN_METRICS.index("train/finite")

    def train_step_chunk(state: TrainState, batches: dict, seed: jax.Array):
        def one(carry, batch):
            state, healthy = carry
            new_state, metrics = step(state, batch, seed)
            healthy = healthy & (metrics[finite] > 0)
            state = jax.tree.map(lambda new, old: jnp.where(healthy, new, old), new_state, state)
            return (state, healthy), metrics

        (state, _), metrics = jax.lax.scan(one, (state, jnp.bool_(True)), batches)
        return state, metrics

    return train_step_chunk


def over_members(step: Callable, backend: str) -> Callable:
    """`step` over a leading member axis K. On a CPU the matmuls of one small model already
    keep the cores busy and vmap's batched matmuls ran slower than K solo steps (0.7x for 8
    tiny members, benchmarks/run.py `ensemble_detail`), while stepping the members in turn
    inside one program ran 1.1x faster; accelerators want the one wide vmapped program."""
    if backend == "cpu":
        return _members_in_turn(step)
    return jax.vmap(step)


def _members_in_turn(step: Callable) -> Callable:
    """(states (K, ...), batches (K, ...), keys (K,)) -> (states, metrics (K, ...)): member i
    read from and written back into the stacked state in place. `lax.map` built its outputs
    as new stacks, so XLA copied the whole stacked state into and out of its loop every step
    (172 copies at dk_exponent:cpu's shape); the in-place loop copies nothing and steps 16
    members ×1.03-1.07 faster on each of 2 pinned cores, to the same bits (2026-12-07,
    `python -m benchmarks.members_loop`, results/members_loop_amd-epyc_2core_2026-12-07.txt)."""

    def train_step_members(states, batches, keys):  # named: compile logs count train steps
        members = jax.tree.leaves(keys)[0].shape[0]
        one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                           (states, batches, keys))
        metrics = jax.tree.map(lambda m: jnp.zeros((members, *m.shape), m.dtype),
                               jax.eval_shape(lambda args: step(*args)[1], one))

        def member(i, carry):
            states, metrics = carry
            take = functools.partial(jax.lax.dynamic_index_in_dim, index=i, keepdims=False)
            new_state, new_metrics = step(*jax.tree.map(take, (states, batches, keys)))
            put = lambda stack, x: jax.lax.dynamic_update_index_in_dim(stack, x, i, 0)  # noqa: E731
            return jax.tree.map(put, states, new_state), jax.tree.map(put, metrics, new_metrics)

        return jax.lax.fori_loop(0, members, member, (states, metrics))

    return train_step_members


@dataclasses.dataclass
class Programs:
    """The jitted programs of one (graphdef, optimiser settings, z_loss)."""

    train: Callable  # (state, batch, seed) -> (state, metrics (M,)) (`seeded`); donates state
    train_members: Callable  # the same over a leading member axis K (jit compiles once per K)
    eval: Callable
    diagnostics: Callable
    # (state, initial q/k weights, batch) -> the logits' sources (`model.logit_sources`)
    logit_sources: Callable
    # The same two without donation: the pipelined loop dispatches step N+1 while step N's
    # hooks may still read state N (evaluation, checkpoints), so state N must outlive it.
    train_kept: Callable
    train_members_kept: Callable
    seeded_step: Callable  # not jitted: what the chunk programs are built from
    chunks: dict = dataclasses.field(default_factory=dict)  # (members > 1, donate) -> program

    def train_program(self, members: int, donate: bool) -> Callable:
        """The train step for `members` runs (1: solo), donating its input state or not."""
        if members == 1:
            return self.train if donate else self.train_kept
        return self.train_members if donate else self.train_members_kept

    def chunk_program(self, members: int, donate: bool) -> Callable:
        """Several train steps in one program (`chunked`), for `members` runs: batches
        (n, B, T), or (K, n, B, T); metrics (n, M), or (K, n, M). Compiled once per n."""
        key = (members > 1, donate)
        if key not in self.chunks:
            program = chunked(self.seeded_step)
            if members > 1:
                program = over_members(program, jax.default_backend())
            self.chunks[key] = jax.jit(program, donate_argnums=0 if donate else (),
                                       compiler_options=compiler_options())
        return self.chunks[key]


_PROGRAMS: dict[tuple, Programs] = {}


def compiler_options() -> dict:
    """XLA options of the run's programs. On a CPU, LLVM's optimisation level 1 instead of 2:
    14% less train-step compile time on a quick sweep (mostly compilation) and the same step
    time, since the matmuls are library calls (2 cores, 2026-11-29: 10.1 s -> 8.6 s for three
    train steps; base.py:cpu 98-100 ms -> 97-98 ms a step).

    And copy insertion by region analysis: without it XLA copies every donated parameter and
    Adam moment at a train step's entry (86 copies at dk_exponent:cpu's shape), because the
    non-finite guard's select reads the old values beside the new; region analysis proves the
    copies needless. Same numbers to the bit; a solo step ×1.15 faster, a 16-run ensemble ×1.05,
    inside the rounds' spread (2 pinned processes, 2026-12-07: `benchmarks/xla_flag_sets.py`)."""
    if jax.default_backend() != "cpu":
        return {}
    return {"xla_backend_optimization_level": 1,
            "xla_cpu_copy_insertion_use_region_analysis": True}


def programs(graphdef: Any, settings: OptimizerSettings, z_loss: float) -> Programs:
    """The shared programs for a model structure and optimiser, built on first use."""
    key = (graphdef, settings, z_loss)
    if key not in _PROGRAMS:
        step = seeded(make_train_step(graphdef, make_optimizer(settings), z_loss,
                                      settings.loss_scaling))
        members = over_members(step, jax.default_backend())
        jit = functools.partial(jax.jit, compiler_options=compiler_options())
        _PROGRAMS[key] = Programs(
            train=jit(step, donate_argnums=0),
            train_members=jit(members, donate_argnums=0),
            eval=jit(make_eval_step(graphdef)),
            diagnostics=jit(make_diagnostics_step(graphdef, z_loss)),
            logit_sources=jit(logit_sources.make_step(graphdef)),
            train_kept=jit(step),
            train_members_kept=jit(members),
            seeded_step=step,
        )
    return _PROGRAMS[key]


def train_step_compilations() -> int:
    """Train-step programs (solo and ensemble) compiled so far by this process."""
    return sum(program._cache_size() for p in _PROGRAMS.values()
               for program in (p.train, p.train_members, p.train_kept, p.train_members_kept,
                               *p.chunks.values()))
