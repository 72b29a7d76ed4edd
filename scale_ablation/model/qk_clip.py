"""QK-clip (MuonClip, Kimi K2 2025; MaxText's `use_qk_clip`): after each optimiser step, every
head whose largest logit in that step's forward pass exceeded T has its W_Q and W_K columns (and
biases) multiplied by √(T / max) each, so that logit, recomputed with the new weights, is T.

The largest logit per head comes from the forward pass the step already makes: each clipping
layer sows it (the dense path's logits, reduced over batch, queries and visible keys; no extra
pass) under `nnx.capture`, the step's loss returns it (`forward`) and the step calls
`after_step` inside the same jitted program, which rescales, keeps the maxima in each layer's
`attention.MaxLogit` state for logging and counts each head's clipped steps in
`attention.ClipCount` (every step, so that a study can say whether the clip ever acted).
q = x·W_Q + b_Q and k likewise are linear in their weights and rotary positions are a rotation,
so scaling both by √γ scales every logit of the head by γ = T / max; heads at or below T are
left alone (factor 1). The factor is applied after the update, to the updated weights
(MuonClip's order).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def _clipping(model: nnx.Module) -> list[tuple[tuple, nnx.Module]]:
    """(path, layer) of each attention layer of `model` whose policy clips (it holds a
    `max_logit`), in graph order."""
    return [(path, module) for path, module in nnx.iter_modules(model)
            if getattr(getattr(module, "policy", None), "qk_clip", None) is not None
            and hasattr(module, "max_logit")]


def clipping_layers(model: nnx.Module) -> list[nnx.Module]:
    """The attention layers of `model` whose policy clips (they hold a `max_logit`)."""
    return [module for _, module in _clipping(model)]


def applies(graphdef: Any, params: Any, rest: Any) -> bool:
    """Whether the model of (graphdef, params, rest) has a clipping layer (trace-time)."""
    return bool(clipping_layers(nnx.merge(graphdef, params, rest)))


def factors(max_logit: jax.Array, threshold: float) -> jax.Array:
    """[H] factor on each of W_Q and W_K: √(T / max) where max > T, else 1."""
    safe = jnp.maximum(max_logit, threshold)  # also keeps T / max finite and positive
    return jnp.where(max_logit > threshold, jnp.sqrt(threshold / safe), 1.0)


def forward(model: nnx.Module, inputs: jax.Array,
            dropout_key: jax.Array | None) -> tuple[jax.Array, list[jax.Array]]:
    """(logits, each clipping layer's largest logit per head [H] in this forward pass, in
    `clipping_layers` order): the layers sow it and `nnx.capture` collects it (Flax's way to
    extract intermediates; a sow outside a capture is deprecated)."""
    (logits, _), sown = nnx.capture(model, nnx.Intermediate)(
        inputs, dropout_key=dropout_key, sow_max_logit=True)
    maxima = []
    for path, _ in _clipping(model):
        node = sown  # the captured State is nested as the model is: follow the layer's path
        for key in path:
            node = node[key]
        maxima.append(node["step_max_logit"].get_value()[-1])  # the tuple's one entry
    return logits, maxima


def after_step(graphdef: Any, params: Any, rest: Any, maxima: list[jax.Array]) -> tuple:
    """(params, rest) after the optimiser step: each clipping layer's W_Q, W_K columns (and
    biases) rescaled from its `maxima` entry, which `rest` records, with each clipped head's
    count of clipped steps raised by one. Pure: new nnx.States."""
    model = nnx.merge(graphdef, params, rest, copy=True)  # copies: mutable in this trace
    for layer, max_logit in zip(clipping_layers(model), maxima, strict=True):
        layer.max_logit.set_value(max_logit)
        clipped = (max_logit > layer.policy.qk_clip).astype(jnp.float32)
        layer.clip_count.set_value(layer.clip_count.get_value() + clipped)
        factor = factors(max_logit, layer.policy.qk_clip)
        per_column = jnp.repeat(factor, layer.qk_dim)  # [H] -> [H·D_qk], head-major as q's split
        for projection in (layer.query, layer.key):
            projection.kernel.set_value(projection.kernel.get_value() * per_column)
            if projection.bias is not None:
                projection.bias.set_value(projection.bias.get_value() * per_column)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    return params, rest
