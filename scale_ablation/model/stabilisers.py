"""Built-in policies that keep the logits bounded or change what turns them into weights:
soft-capping, sigmoid attention, attention sinks and QK-clip.

All four keep 1/√d_k as their multiplier; they act after it (soft-cap), in place of the softmax
(sigmoid, sink) or on the weights after the optimiser step (QK-clip). None can be computed by
the fused kernel, which never exposes the logits (`ScalePolicy.fused_unsupported`). Imported by
the registry on its first lookup (`policies.BUILTIN_MODULES`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from scale_ablation.model.policies import ScalePolicy, _no_arg, parse_number, register


def _inv_sqrt(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


@functools.cache
def _softcap(cap: float) -> ScalePolicy:
    return ScalePolicy(base_scale_fn=_inv_sqrt,
                       transform_scaled=lambda logits: cap * jnp.tanh(logits / cap),
                       soft_cap=cap)


@register("softcap")
def softcap(arg: str | None) -> ScalePolicy:
    """C·tanh(s·z / C) before the softmax, C default 50 (Gemma 2's `attn_logits_soft_cap`;
    MaxText, levanter). Compose to cap another policy's logits: `qk_rmsnorm+softcap:30`."""
    return _softcap(parse_number("softcap", arg, default=50.0, expects="a positive cap C"))


@functools.cache
def _sigmoid(bias: float | None) -> ScalePolicy:
    def weights(params, logits, mask, seq_len):
        b = -math.log(seq_len) if bias is None else bias
        out = jax.nn.sigmoid(logits + jnp.asarray(b, logits.dtype))
        return out if mask is None else jnp.where(mask, out, 0)

    return ScalePolicy(base_scale_fn=_inv_sqrt, weights=weights, weights_sum_to_one=False)


@register("sigmoid")
def sigmoid(arg: str | None) -> ScalePolicy:
    """Weights σ(s·z + b) on each visible key, not normalised over keys; b = B when given, else
    −ln T with T the sequence length (Ramapuram et al. 2024, "Theory, analysis, and best
    practices for sigmoid self-attention"; apple/ml-sigmoid-attention)."""
    if arg is None:
        return _sigmoid(None)
    return _sigmoid(parse_number("sigmoid", arg, default=None, expects="a bias B, e.g. -5",
                                 positive=False))


def _sink_init(rng, *, num_heads, head_dim, base_scale):
    return {"sink": jnp.zeros((num_heads,), jnp.float32)}


def _sink_weights(params, logits, mask, seq_len):
    """softmax over [visible keys, the sink], the sink's column dropped: its value is zero."""
    masked = logits if mask is None else jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    batch, heads, q_len, _ = logits.shape
    sink = jnp.broadcast_to(params["sink"].astype(logits.dtype)[None, :, None, None],
                            (batch, heads, q_len, 1))  # [H] -> [B, H, Tq, 1]
    return jax.nn.softmax(jnp.concatenate([masked, sink], -1), axis=-1)[..., :-1]


def _sink_values(params):
    return {"sink": params["sink"]}


@register("sink")
def sink(arg: str | None) -> ScalePolicy:
    """1/√d_k, and one learned logit per head (from 0) joins every query's softmax as a key whose
    value is zero, so the weights over the real keys sum to less than one (GPT-OSS's `sinks`,
    openai/gpt-oss; MaxText's `attention_sink`)."""
    _no_arg("sink", arg)
    return ScalePolicy(base_scale_fn=_inv_sqrt, init_fn=_sink_init, weights=_sink_weights,
                       weights_sum_to_one=False, learned_values=_sink_values)


@register("qk_clip")
def qk_clip(arg: str | None) -> ScalePolicy:
    """1/√d_k; after each optimiser step, every head whose largest logit s·q·k in that step
    exceeded T (default 100) has its W_Q and W_K columns multiplied by √(T / max) each, which
    brings that logit back to T (MuonClip, Kimi K2 2025; MaxText's `use_qk_clip`).
    `scale_ablation.model.qk_clip` does the rescaling inside the jitted train step."""
    threshold = parse_number("qk_clip", arg, default=100.0, expects="a positive threshold T")
    return ScalePolicy(base_scale_fn=_inv_sqrt, qk_clip=threshold)
