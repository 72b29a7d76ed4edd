"""Built-in policies beyond the fixed and learned scales of `policies`: q/k normalisations
(QK-LayerNorm, QK-RMSNorm, their gain-free and global variants, cosine attention), length- and
position-aware scales (log-length, Llama 4's temperature, YaRN), scales that see the model (head
width, layer index) and the article's pitfall 2 (LayerNorm of the logits).

Imported by the registry on its first lookup (`policies.BUILTIN_MODULES`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from scale_ablation.model.policies import (
    Dims,
    ScalePolicy,
    _no_arg,
    parse_number,
    register,
    scalar,
    scalar_of_dims,
)

# --------------------------------------------------------------------------- QK normalisation


@functools.cache
def _qk_norm(center: bool, gain: bool = True, over_heads: bool = False,
             eps: float = 1e-6) -> ScalePolicy:
    """Normalise q and k (centred: LayerNorm; else RMSNorm) over head_dim, or over heads ×
    head_dim together (`over_heads`: before the split into heads), with a learnable gain or none.
    """
    axes = (-2, -1) if over_heads else (-1,)

    def init_fn(rng, *, num_heads, head_dim, base_scale):
        if not gain:
            return {}
        # 1-D (flattened over heads), so weight decay leaves the gains alone like any norm gain.
        width = num_heads * head_dim if over_heads else head_dim
        return {"q_gain": jnp.ones((width,), jnp.float32),
                "k_gain": jnp.ones((width,), jnp.float32)}

    def normalise(x, params, name):
        x32 = x.astype(jnp.float32)
        if center:
            x32 = x32 - x32.mean(axes, keepdims=True)
        x32 = x32 * jax.lax.rsqrt((x32 * x32).mean(axes, keepdims=True) + eps)
        if gain:
            x32 = x32 * params[name].reshape(x.shape[-len(axes):])  # (H·D,) -> (H, D) if global
        return x32.astype(x.dtype)

    def transform_qk(params, q, k):
        return normalise(q, params, "q_gain"), normalise(k, params, "k_gain")

    return ScalePolicy(
        base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim),
        init_fn=init_fn,
        transform_qk=transform_qk,
    )


@register("qk_layernorm")
def qk_layernorm(arg: str | None) -> ScalePolicy:
    """LayerNorm of q and k over head_dim with learnable gain, then 1/√d_k (Dehghani et al. 2023)."""
    _no_arg("qk_layernorm", arg)
    return _qk_norm(center=True)


@register("qk_rmsnorm")
def qk_rmsnorm(arg: str | None) -> ScalePolicy:
    """RMSNorm of q and k over head_dim with learnable gain, then 1/√d_k (Wortsman et al. 2023)."""
    _no_arg("qk_rmsnorm", arg)
    return _qk_norm(center=False)


@register("qk_rmsnorm_nogain")
def qk_rmsnorm_nogain(arg: str | None) -> ScalePolicy:
    """q and k divided by their RMS over head_dim, no gain, then 1/√d_k (Llama 4's `L2Norm`:
    x·rsqrt(mean(x²) + 1e-6), transformers' `Llama4TextL2Norm`)."""
    _no_arg("qk_rmsnorm_nogain", arg)
    return _qk_norm(center=False, gain=False)


@register("qk_layernorm_global")
def qk_layernorm_global(arg: str | None) -> ScalePolicy:
    """LayerNorm of q and of k over heads × head_dim together (before the split into heads) with
    a learnable gain, then 1/√d_k (OLMo's `attention_layer_norm`, eps 1e-5)."""
    _no_arg("qk_layernorm_global", arg)
    return _qk_norm(center=True, gain=True, over_heads=True, eps=1e-5)


@functools.cache
def _cosine(max_scale: float) -> ScalePolicy:
    def init_fn(rng, *, num_heads, head_dim, base_scale):
        return {"logit_scale": jnp.full((num_heads,), math.log(10.0), jnp.float32)}

    def unit(x):
        x32 = x.astype(jnp.float32)
        norm = jnp.sqrt((x32 * x32).sum(-1, keepdims=True))
        return (x32 / jnp.maximum(norm, 1e-12)).astype(x.dtype)  # torch's F.normalize

    def scale(params, ctx):
        return jnp.exp(jnp.minimum(params["logit_scale"], math.log(max_scale)))  # [heads]

    return ScalePolicy(
        base_scale_fn=lambda head_dim: 10.0,
        scale=scale,
        init_fn=init_fn,
        transform_qk=lambda params, q, k: (unit(q), unit(k)),
        learned_values=lambda params: {"cosine_scale": scale(params, None)},
    )


@register("cosine")
def cosine(arg: str | None) -> ScalePolicy:
    """(q/‖q‖)·(k/‖k‖) × exp(min(ℓ, ln M)), ℓ learned per head from ln 10, M default 100 (Swin
    Transformer v2's `logit_scale`, Liu et al. 2022). ℓ is 1-D, so weight decay leaves it alone."""
    return _cosine(parse_number("cosine", arg, default=100.0, expects="a positive cap M"))


# --------------------------------------------------------------------------- length-aware


@register("log_length")
def log_length(arg: str | None) -> ScalePolicy:
    """s·ln(n)/√d_k with n the keys a query sees and s learnable per head (Nakanishi 2025)."""
    return _log_length(parse_number("log_length", arg, default=1.0, expects="a positive initial s"))


@functools.cache
def _log_length(s_init: float) -> ScalePolicy:
    def init_fn(rng, *, num_heads, head_dim, base_scale):
        return {"log_length_s": jnp.full((num_heads,), s_init, jnp.float32)}

    def scale(params, ctx):
        # [q_len, 1] * [heads] -> [q_len, heads]
        return jnp.log(ctx.num_keys)[:, None] * params["log_length_s"] * ctx.base_scale

    return ScalePolicy(
        base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim),
        scale=scale,
        init_fn=init_fn,
        learned_values=lambda params: {"log_length_s": params["log_length_s"]},
    )


@functools.cache
def _temperature(floor_scale: float, attn_scale: float) -> ScalePolicy:
    def scale(params, ctx):
        # [q_len, 1]: one multiplier per query position, the same for every head
        tuning = attn_scale * jnp.log1p(jnp.floor((ctx.positions + 1.0) / floor_scale)) + 1.0
        return (tuning * ctx.base_scale)[:, None]

    return ScalePolicy(base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim), scale=scale)


@register("temperature")
def temperature(arg: str | None) -> ScalePolicy:
    """1/√d_k · (A·ln(1 + ⌊(position + 1)/F⌋) + 1) per query, `temperature:F,A` (defaults 8192,
    0.1): Llama 4's attention temperature tuning (`floor_scale`, `attn_scale`; transformers'
    `Llama4TextAttention`), applied to q and so on both paths."""
    floor_arg, _, scale_arg = (arg or "").partition(",")
    floor_scale = parse_number("temperature", floor_arg or None, default=8192.0,
                               expects="F,A: a positive floor scale F and attention scale A")
    attn_scale = parse_number("temperature", scale_arg or None, default=0.1,
                              expects="F,A: a positive floor scale F and attention scale A")
    return _temperature(floor_scale, attn_scale)


@register("yarn")
def yarn(arg: str | None) -> ScalePolicy:
    """1/√d_k · (0.1·ln S + 1)² for a context extended S times (YaRN's mscale, Peng et al. 2023,
    applied to both q and k: hence the square); 1/√d_k for S ≤ 1, as YaRN's `get_mscale`."""
    factor = parse_number("yarn", arg, default=None, expects="a positive context scale S")
    mscale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return scalar(lambda head_dim: mscale**2 / math.sqrt(head_dim))


# --------------------------------------------------------------------------- scales that see the model


@register("inv_sqrt_head_width")
def inv_sqrt_head_width(arg: str | None) -> ScalePolicy:
    """1/√(d_model / num_heads), whatever d_k: Gemma 2 27B's `query_pre_attn_scalar`
    (d_model/num_heads = 144, head_dim 128). Differs from 1/√d_k once `model.qk_dim` sets q/k
    apart from d_model / num_heads."""
    _no_arg("inv_sqrt_head_width", arg)
    return scalar_of_dims(lambda dims: 1.0 / math.sqrt(dims.head_width))


def _inv_layer_scale(power: float):
    def base_scale(dims: Dims) -> float:
        return 1.0 / (math.sqrt(dims.head_dim) * (dims.layer + 1) ** power)

    return base_scale


@register("inv_layer")
def inv_layer(arg: str | None) -> ScalePolicy:
    """1/√d_k / (layer index + 1)^P, P default 1 (GPT-2's `scale_attn_by_inverse_layer_idx` in
    transformers, Mistral/Stanford CRFM). A scalar policy: each layer's number is its input."""
    power = parse_number("inv_layer", arg, default=1.0, expects="a positive power P")
    return scalar_of_dims(_inv_layer_scale(power))


# --------------------------------------------------------------------------- pitfall 2


def _layernorm_over_keys(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Normalise each query's row of raw logits over the keys it can see."""
    if mask is None:
        mean = logits.mean(-1, keepdims=True)
        var = ((logits - mean) ** 2).mean(-1, keepdims=True)
    else:
        count = mask.sum(-1, keepdims=True)
        mean = jnp.where(mask, logits, 0).sum(-1, keepdims=True) / count
        var = jnp.where(mask, (logits - mean) ** 2, 0).sum(-1, keepdims=True) / count
    return (logits - mean) * jax.lax.rsqrt(var + 1e-5)


@register("logit_layernorm")
def logit_layernorm(arg: str | None) -> ScalePolicy:
    """LayerNorm over the key axis of q·k, then 1/√d_k: the article's pitfall 2, kept to measure."""
    _no_arg("logit_layernorm", arg)
    return ScalePolicy(
        base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim),
        transform_logits=_layernorm_over_keys,
    )
