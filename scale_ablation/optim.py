"""The optimiser: AdamW with global-norm clipping, warmup and cosine decay.

The peak learning rate is not part of it: it lives in the train state and multiplies the
updates, so that runs differing only in lr share one compiled program (and one ensemble).
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import optax


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
