"""Where the attention logits come from (issue 53, item 5): the part the initial q/k weights give
and the part the updates since then give, per layer, at a diagnostics step.

Each attention layer's input x goes through the current projections (q = x·W_q + b_q, k
likewise) and through the initial ones (q₀ = x·W_q0 + b_q0, k₀), then through the same rotary
positions and the policy's q/k transform. The pre-scale logits q·k split into the initial
weights' part q₀·k₀ and the updates' part q·k − q₀·k₀ (which holds the cross terms q₀·Δk and
Δq·k₀ as well as Δq·Δk). Four standard deviations per layer, each over every (batch, head,
query, key) a causal query can see, heads pooled:

- `qk_std`: of q·k, the pre-scale logits;
- `qk_std_init`: of q₀·k₀;
- `qk_std_update`: of q·k − q₀·k₀;
- `qk_std_scaled`: of q·k after the policy's scale (and its logit transform, if any): what
  enters the softmax. The health stats' `logit_std` is the same logits' std per head, then
  averaged over heads; this one pools the heads.

qk_std² = qk_std_init² + qk_std_update² + 2·cov, so the two parts need not add up. At step 0
the update part is 0 and qk_std equals qk_std_init. Everything is computed in float32.

The inputs x are the current model's (its own forward pass, on the reference or any other
attention path): the decomposition asks how much of today's logits today's weights owe to
their starting point, on today's activations.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from scale_ablation.model import umup
from scale_ablation.model.attention import SelfAttention, apply_rotary, causal_mask, query_scale

# A projection's weights: (kernel [C, H·D_qk], bias [H·D_qk] or None).
Projection = tuple[jax.Array, jax.Array | None]
# Per attention layer, in `attention_layers` order: {"query": Projection, "key": Projection}.
InitialQK = tuple[dict[str, Projection], ...]
STATS = ("qk_std", "qk_std_init", "qk_std_update", "qk_std_scaled")
_TAPPED = "attention_input"  # the name each tap sows its input under


def attention_layers(model: nnx.Module) -> list[SelfAttention]:
    """The model's attention layers in graph order."""
    return [module for _, module in nnx.iter_modules(model) if isinstance(module, SelfAttention)]


def _weights(linear: nnx.Linear) -> Projection:
    """(kernel, bias) as the layer applies them: u-μP's forward multiplier folded in."""
    factor = umup.forward_multiplier(linear)
    kernel, bias = linear.kernel.get_value(), linear.bias
    bias = None if bias is None else bias.get_value()
    if factor == 1.0:
        return kernel, bias
    return kernel * factor, None if bias is None else bias * factor


def initial_qk(model: nnx.Module) -> InitialQK:
    """The q/k projections' weights of `model` (the run's model at step 0), copied: the train
    step donates the state's buffers, and these must outlive them."""
    def kept(projection: Projection) -> Projection:
        return jax.tree.map(jnp.copy, projection)

    return tuple({"query": kept(_weights(layer.query)), "key": kept(_weights(layer.key))}
                 for layer in attention_layers(model))


class _Tap(nnx.Module):
    """Stands in for a layer's query projection: sows its input, then projects as it would."""

    def __init__(self, inner: nnx.Linear):
        self.inner = inner

    def __call__(self, x: jax.Array) -> jax.Array:
        self.sow(nnx.Intermediate, _TAPPED, x)
        return self.inner(x)


def attention_inputs(model: nnx.Module, inputs: jax.Array) -> list[jax.Array]:
    """Each attention layer's input [B, T, C] in a forward pass of `inputs` [B, T]. `model` is
    changed (its query projections tapped): pass a copy made for this (`nnx.merge` inside a
    program), never a model in use."""
    layers = attention_layers(model)
    for layer in layers:
        layer.query = _Tap(layer.query)
    _, sown = nnx.capture(model, nnx.Intermediate)(inputs)
    found = []
    for path, module in nnx.iter_modules(model):
        if isinstance(module, _Tap):
            node = sown  # the captured State is nested as the model is
            for key in path:
                node = node[key]
            found.append(node[_TAPPED].get_value()[-1])  # the tuple's one entry
    for layer in layers:
        layer.query = layer.query.inner
    return found


def _project(x: jax.Array, projection: Projection) -> jax.Array:
    kernel, bias = projection
    out = x.astype(jnp.float32) @ kernel.astype(jnp.float32)
    return out if bias is None else out + bias.astype(jnp.float32)


def _qk(layer: SelfAttention, x: jax.Array, query: Projection,
        key: Projection) -> tuple[jax.Array, jax.Array]:
    """q and k [B, T, H, D_qk] of input x through the given projections, after the layer's
    rotary positions and its policy's q/k transform."""
    batch, seq, _ = x.shape
    split = (batch, seq, layer.num_heads, layer.qk_dim)
    q, k = _project(x, query).reshape(split), _project(x, key).reshape(split)  # [B,T,H·D] -> split
    if layer.rotary:
        positions = jnp.arange(seq)
        q, k = apply_rotary(q, positions), apply_rotary(k, positions)
    return layer.policy.transform_qk(layer.policy_params.get_value(), q, k)


def _visible_std(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """The std of `logits` [B, H, Tq, Tk] over every entry `mask` [Tq, Tk] leaves visible."""
    visible = jnp.broadcast_to(mask, logits.shape)
    count = visible.sum()
    mean = jnp.where(visible, logits, 0.0).sum() / count
    return jnp.sqrt(jnp.where(visible, (logits - mean) ** 2, 0.0).sum() / count)


def layer_sources(layer: SelfAttention, x: jax.Array, initial: dict[str, Projection]
                  ) -> dict[str, jax.Array]:
    """The four standard deviations (`STATS`) of one layer for its input x [B, T, C]."""
    q, k = _qk(layer, x, _weights(layer.query), _weights(layer.key))
    q0, k0 = _qk(layer, x, initial["query"], initial["key"])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)  # [B, H, Tq, Tk]
    from_init = jnp.einsum("bqhd,bkhd->bhqk", q0, k0)
    seq = x.shape[1]
    mask = causal_mask(seq, seq)
    policy, params = layer.policy, layer.policy_params.get_value()
    scale = query_scale(policy, params, q_len=seq, k_len=seq, num_heads=layer.num_heads,
                        head_dim=layer.qk_dim, causal=True, base_scale=layer.base_scale[...])
    entering = logits if policy.transform_logits is None else policy.transform_logits(logits,
                                                                                       mask)
    scaled = entering * scale.T[None, :, :, None]  # [Tq, H] -> [1, H, Tq, 1]
    return {"qk_std": _visible_std(logits, mask),
            "qk_std_init": _visible_std(from_init, mask),
            "qk_std_update": _visible_std(logits - from_init, mask),
            "qk_std_scaled": _visible_std(scaled, mask)}


def logit_sources(model: nnx.Module, initial: InitialQK, inputs: jax.Array
                  ) -> dict[str, jax.Array]:
    """Flat metrics `attn/layer{i}/{stat}` for every layer and `STATS` entry, float32 scalars.
    `model`: a copy made for this (see `attention_inputs`); `initial`: `initial_qk` of the
    run's model at step 0; `inputs`: tokens [B, T]."""
    out = {}
    xs = attention_inputs(model, inputs)
    for index, (layer, x, init) in enumerate(zip(attention_layers(model), xs, initial,
                                                 strict=True)):
        for name, value in layer_sources(layer, x, init).items():
            out[f"attn/layer{index}/{name}"] = value
    return out


def make_step(graphdef: Any):
    """(state, initial, batch) -> `logit_sources` of the state's model on the batch's inputs:
    the diagnostics' program (`training.steps.Programs.logit_sources`)."""

    def logit_sources_step(state: dict, initial: InitialQK, batch: dict):
        model = nnx.merge(graphdef, state["params"], state["rest"])
        return logit_sources(model, initial, batch["inputs"])

    return logit_sources_step
