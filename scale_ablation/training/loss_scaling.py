"""Loss scaling for float16 training: none, static, or dynamic as jmp and optax practise it.

float16's smallest normal number is 6.1e-5: small gradients flowing back through float16
activations underflow to zero. Multiplying the loss by a scale S multiplies every cotangent by
S, lifting them into range; the parameters' gradients (float32, as the parameters are) are then
divided by S before the optimiser sees them. The two cancel: in float32 the update is the
unscaled one to round-off (tests/test_loss_scaling.py; not bit for bit even for S = 2^k, since
XLA compiles the two programs' fusions apart).

`train.loss_scale` = 0: none (the train step is the one it always was); S > 0 with
`train.loss_scale_period` = 0: static S. With a period N > 0 the scale is dynamic, starting
at S, or at `DYNAMIC_START` when S is 0 (jmp's `DynamicLossScale`): a step whose gradients are not all finite is skipped (the
parameters, the optimiser's state and so the schedule's count stay as they were) and S is
halved, down to `MIN_SCALE`; after N finite steps in a row S is doubled. A non-finite gradient
at `MIN_SCALE` is not an overflow scaling can cure: the run has diverged, as without scaling.

The dynamic state (S and the count of finite steps) lives in the optimiser's state
(`DynamicScaleState`, wrapping the optimiser's own, as `optax.apply_if_finite` does), so it is
checkpointed and restored with it, and in an ensemble each member has its own. A skipped
step leaves the schedule's count too (as `optax.apply_if_finite` and jmp's examples do), so
after k skips the optimiser's LR multiplier is that of k steps earlier than the logged
`train/lr`, which follows the run's step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

MIN_SCALE = 1.0  # jmp's default min_loss_scale: below it scaling only shrinks gradients
FACTOR = 2.0  # halve on overflow, double after a period of finite steps (jmp, optax)
DYNAMIC_START = 2.0**15  # jmp's examples' start (PyTorch's GradScaler: 2**16)


@dataclasses.dataclass(frozen=True)
class LossScaling:
    """`scale`: 0 none, else the static scale or the dynamic one's start; `period`: 0 static,
    else the finite steps after which a dynamic scale doubles."""

    scale: float = 0.0
    period: int = 0

    @classmethod
    def of(cls, train: ml_collections.ConfigDict) -> LossScaling:
        """The scaling of a run's `config.train`; configs written before the fields: none."""
        scale, period = float(train.get("loss_scale", 0.0)), int(train.get("loss_scale_period", 0))
        return cls(scale or (DYNAMIC_START if period > 0 else 0.0), period)

    @property
    def enabled(self) -> bool:
        return self.scale > 0

    @property
    def dynamic(self) -> bool:
        return self.enabled and self.period > 0


NONE = LossScaling()


class DynamicScaleState(NamedTuple):
    """A dynamic loss scale's state around the optimiser's own."""

    scale: jax.Array  # () float32: the scale the next step's loss is multiplied by
    good_steps: jax.Array  # () int32: finite steps in a row since the scale last changed
    inner: optax.OptState


def all_finite(tree: Any) -> jax.Array:
    """() bool: every entry of every leaf finite."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def adjust(scale: jax.Array, good_steps: jax.Array, finite: jax.Array,
           period: int) -> tuple[jax.Array, jax.Array]:
    """jmp's `DynamicLossScale.adjust`: (scale, good_steps) after a step whose gradients were
    all `finite` or not. A doubling that would overflow float32 keeps the scale."""
    grown = scale * FACTOR
    at_period = good_steps + 1 >= period
    kept = jnp.where(at_period & jnp.isfinite(grown), grown, scale)
    new_scale = jnp.where(finite, kept, jnp.maximum(scale / FACTOR, MIN_SCALE))
    new_good = jnp.where(finite & ~at_period, good_steps + 1, 0).astype(good_steps.dtype)
    return new_scale.astype(scale.dtype), new_good


def dynamic_loss_scale(inner: optax.GradientTransformation,
                       scaling: LossScaling) -> optax.GradientTransformation:
    """`inner` behind a dynamic loss scale: it sees only finite (unscaled) gradients; a step
    with any non-finite one yields zero updates and leaves `inner`'s state as it was."""

    def init(params) -> DynamicScaleState:
        return DynamicScaleState(jnp.asarray(scaling.scale, jnp.float32),
                                 jnp.zeros((), jnp.int32), inner.init(params))

    def update(grads, state: DynamicScaleState, params=None):
        finite = all_finite(grads)
        updates, inner_state = inner.update(grads, state.inner, params)
        updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), updates)
        inner_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                   inner_state, state.inner)
        scale, good_steps = adjust(state.scale, state.good_steps, finite, scaling.period)
        return updates, DynamicScaleState(scale, good_steps, inner_state)

    return optax.GradientTransformation(init, update)


def current_scale(scaling: LossScaling, opt_state: Any) -> jax.Array:
    """() float32: the scale this step's loss is multiplied by (1 without scaling)."""
    if scaling.dynamic:
        if not isinstance(opt_state, DynamicScaleState):
            raise ValueError("dynamic loss scaling needs the optimiser make_optimizer builds "
                             "for it (its state holds the scale)")
        return opt_state.scale
    return jnp.asarray(scaling.scale if scaling.enabled else 1.0, jnp.float32)


def scaled(loss_fn: Callable, scaling: LossScaling, scale: jax.Array) -> Callable:
    """`loss_fn` (-> (loss, aux)) with its loss multiplied by `scale`: what is differentiated.
    Without scaling, `loss_fn` itself (the program of runs before loss scaling existed)."""
    if not scaling.enabled:
        return loss_fn

    def scaled_loss(*args):
        loss, aux = loss_fn(*args)
        return loss * scale, aux

    return scaled_loss


def unscale(scaling: LossScaling, grads: Any, scale: jax.Array) -> Any:
    """The gradients of the unscaled loss: each float32 leaf divided by `scale`."""
    if not scaling.enabled:
        return grads
    return jax.tree.map(lambda g: g / scale.astype(g.dtype), grads)


def may_skip(scaling: LossScaling, scale: jax.Array) -> jax.Array | bool:
    """Whether a non-finite gradient under `scale` is an overflow the scale can back off from
    (a skipped step, the run healthy) rather than a divergence."""
    if not scaling.dynamic:
        return False
    return scale > MIN_SCALE
