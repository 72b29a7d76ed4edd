"""The optimiser: AdamW with global-norm clipping, warmup and cosine decay.

The peak learning rate is not part of it: it lives in the train state and multiplies the
updates, so that runs differing only in lr share one compiled program (and one ensemble).
`train.scale_lr_multiplier` gives the scale policy's own parameters (every leaf under a
layer's `policy_params`: a learned scale's `log_scale`, log-length's `s`, QK-norm gains) a
learning rate that many times the others'.

Under `model.parametrization=mup`, Adam's step of each matrix-like parameter is multiplied by
base fan_in / fan_in (`scale_ablation.model.base_shapes`), before the weight decay: the mup
package's `MuAdamW` divides such a group's lr by the width multiplier and multiplies its
weight_decay by it, which leaves the decoupled decay lr·wd·p as it was. Under `sp` there is no
such step at all: the optimiser (and its state) is the one it always was. Under `umup` (u-μP,
`scale_ablation.model.umup`) the same step takes u-μP's absolute multipliers (a weight's
fan_in^-½, × L^-½ inside the blocks), the decay again left as it is.

Under `model.depth_alpha` (CompleteP, `scale_ablation.model.depth`) every parameter inside a
residual block takes AdamW's whole update (Adam's step and the decay) × m_L^(α-1), after the decay,
and Adam's ε × m_N^-1 · m_L^-α (a second Adam over those parameters). Off, neither part exists.

Under a dynamic loss scale (`training.loss_scaling`) the whole chain sits inside the scale's
state, which skips a step with non-finite gradients; static or no scaling changes nothing here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from scale_ablation.model import base_shapes, depth
from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import run_config
from scale_ablation.training.loss_scaling import NONE as NO_LOSS_SCALING
from scale_ablation.training.loss_scaling import LossScaling, dynamic_loss_scale


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """What the optimiser's program depends on (the peak learning rate is not: it is traced)."""

    steps: int
    warmup_steps: int
    grad_clip: float
    weight_decay: float
    scale_lr_multiplier: float = 1.0  # LR of the scale policy's parameters / everyone else's
    # μP: (keystr path, Adam-step multiplier) of each parameter whose multiplier is not 1.
    param_lr_multipliers: tuple[tuple[str, float], ...] = ()
    # train.loss_scale, train.loss_scale_period: a dynamic scale's state wraps the optimiser's.
    loss_scaling: LossScaling = NO_LOSS_SCALING
    # CompleteP: the residual blocks' AdamW update multiplier and Adam ε multiplier.
    depth_lr_multiplier: float = 1.0
    depth_eps_multiplier: float = 1.0

    @classmethod
    def of(cls, config: ml_collections.ConfigDict,
           model: ModelConfig | None = None) -> OptimizerSettings:
        """The settings of `config`; `model`: its ModelConfig, if the caller has it (μP's
        multipliers need it)."""
        t = config.train
        # Configs written before the field existed train as they did: multiplier 1.
        multipliers, lr_depth, eps_depth = (), 1.0, 1.0
        if config.model.get("parametrization", "sp") != "sp" or config.model.get("depth_alpha"):
            model = run_config.model_config(config) if model is None else model
            multipliers = base_shapes.lr_multipliers(model)
            lr_depth, eps_depth = depth.lr_multiplier(model), depth.eps_multiplier(model)
        return cls(t.steps, t.warmup_steps, float(t.grad_clip), float(t.weight_decay),
                   float(t.get("scale_lr_multiplier", 1.0)), multipliers, LossScaling.of(t),
                   lr_depth, eps_depth)


ADAM_EPS = 1e-8  # Adam's ε (CompleteP's ε_base)
# The NNX attribute that holds a layer's scale-policy parameters (attention.SelfAttention).
POLICY_PARAMS = "policy_params"


def scale_policy_mask(params):
    """A pytree of bools like `params`: True on the leaves under a `policy_params` node."""
    def is_policy(path, _leaf) -> bool:
        return any(getattr(key, "key", None) == POLICY_PARAMS for key in path)
    return jax.tree_util.tree_map_with_path(is_policy, params)


def block_mask(params):
    """A pytree of bools like `params`: True on the leaves inside a residual block."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _leaf: depth.in_block(jax.tree_util.keystr(path)), params)


def block_labels(params):
    """'block' on the leaves inside a residual block, 'other' elsewhere (optax's labels)."""
    return jax.tree.map(lambda inside: "block" if inside else "other", block_mask(params))


def scale_by_adam(settings: OptimizerSettings) -> optax.GradientTransformation:
    """Adam's step, ε = ADAM_EPS; under CompleteP the residual blocks' with ε ×
    `depth_eps_multiplier`, as a second Adam over those parameters."""
    def adam(eps: float) -> optax.GradientTransformation:
        return optax.scale_by_adam(b1=0.9, b2=0.95, eps=eps)

    plain = adam(ADAM_EPS)
    if settings.depth_eps_multiplier == 1.0:
        return plain
    blocks = adam(ADAM_EPS * settings.depth_eps_multiplier)
    return optax.multi_transform({"block": blocks, "other": plain}, block_labels)


def scale_by_path(multipliers: tuple[tuple[str, float], ...]) -> optax.GradientTransformation:
    """Multiply each update leaf whose keystr path is listed by its multiplier (stateless)."""
    table = dict(multipliers)

    def update(updates, state, params=None):
        def scale(path, leaf):
            factor = table.get(jax.tree_util.keystr(path))
            return leaf if factor is None else leaf * jnp.asarray(factor, leaf.dtype)
        return jax.tree_util.tree_map_with_path(scale, updates), state

    def init(params):
        # A path that names no parameter would leave its multiplier silently unapplied.
        present = {jax.tree_util.keystr(path)
                   for path, _ in jax.tree_util.tree_leaves_with_path(params)}
        if missing := sorted(set(table) - present):
            raise ValueError(f"LR multipliers for parameters the model lacks: {missing[:3]}")
        return optax.EmptyState()

    return optax.GradientTransformation(init, update)


def lr_multiplier(config: ml_collections.ConfigDict | OptimizerSettings) -> optax.Schedule:
    """Linear warmup to 1, then cosine decay to 0.1 at the last step."""
    settings = config if isinstance(config, OptimizerSettings) else OptimizerSettings.of(config)
    steps, warmup = settings.steps, settings.warmup_steps
    cosine = optax.cosine_decay_schedule(1.0, max(steps - warmup, 1), alpha=0.1)
    if warmup <= 0:
        return cosine
    return optax.join_schedules([optax.linear_schedule(0.0, 1.0, warmup), cosine], [warmup])


@functools.cache
def lr_multiplier_program(settings: OptimizerSettings) -> Callable[[int], jax.Array]:
    """`lr_multiplier` as one jitted program per settings, for the host's logging: called
    eagerly, optax's schedule compiled a dozen one-op programs (cos, power, clip, ...)."""
    return jax.jit(lr_multiplier(settings))


def make_optimizer(
    config: ml_collections.ConfigDict | OptimizerSettings,
) -> optax.GradientTransformation:
    """AdamW with clipping and the schedule; the peak learning rate is applied outside, from
    the state, so that runs differing only in lr share one compiled program (and vmap)."""
    settings = config if isinstance(config, OptimizerSettings) else OptimizerSettings.of(config)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    schedule = lr_multiplier(settings)
    parts = [
        scale_by_adam(settings),
        optax.add_decayed_weights(settings.weight_decay, mask=decay_mask),
        optax.scale_by_schedule(lambda count: -schedule(count)),
    ]
    if settings.depth_lr_multiplier != 1.0:  # CompleteP: the whole AdamW update, decay included
        parts.insert(2, optax.masked(optax.scale(settings.depth_lr_multiplier), block_mask))
    if settings.scale_lr_multiplier != 1.0:
        # After the decay, so the multiplier is the policy parameters' whole learning rate (a
        # decayed one's decay included; today's are all 1-D, so none is decayed). Added only
        # when it changes something: multiplier 1 keeps the optimiser state of earlier runs.
        parts.insert(2, optax.masked(optax.scale(settings.scale_lr_multiplier),
                                     scale_policy_mask))
    if settings.param_lr_multipliers:  # μP: Adam's step only, not the decay (MuAdamW)
        parts.insert(1, scale_by_path(settings.param_lr_multipliers))
    if settings.grad_clip > 0:
        parts.insert(0, optax.clip_by_global_norm(settings.grad_clip))
    if settings.loss_scaling.dynamic:  # outermost: a skipped step leaves every part's state
        return dynamic_loss_scale(optax.chain(*parts), settings.loss_scaling)
    return optax.chain(*parts)
