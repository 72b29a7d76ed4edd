"""Attention with a pluggable scale policy: the functional `attend` and the NNX module on top.

Layout throughout is the `jax.nn.dot_product_attention` one: [batch, seq, heads, head_dim].
Two backends compute the same function:
- "reference": explicit logits and softmax in XLA; the only path that can return the
  probabilities (diagnostics), apply attention dropout or a policy's logit transform.
- "fused": `jax.nn.dot_product_attention` (cuDNN on GPU where it applies, XLA elsewhere) with the
  policy's multiplier folded into q, so learned and traced scales work with a kernel whose own
  `scale` argument must be a static float.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from scale_ablation.model import diagnostics
from scale_ablation.model.initializers import kernel_init
from scale_ablation.model.policies import Params, ScaleContext, ScalePolicy
from scale_ablation.model.spec import ModelConfig

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logging.warning(message)


@dataclasses.dataclass(frozen=True)
class AttentionInternals:
    """What the reference path can expose, for diagnostics."""

    logits: jax.Array  # [B, H, Tq, Tk] post-scale, pre-mask
    probs: jax.Array  # [B, H, Tq, Tk]
    mask: jax.Array | None  # [Tq, Tk] bool, True where a query may look


def causal_mask(q_len: int, k_len: int) -> jax.Array:
    """[Tq, Tk] bool; query i sits at key position i + (Tk - Tq)."""
    return jnp.tril(jnp.ones((q_len, k_len), bool), k=k_len - q_len)


def _keys_per_query(q_len: int, k_len: int, causal: bool) -> jax.Array:
    if causal:
        return jnp.arange(1, q_len + 1, dtype=jnp.float32) + (k_len - q_len)
    return jnp.full((q_len,), k_len, jnp.float32)


def query_scale(
    policy: ScalePolicy,
    params: Params,
    *,
    q_len: int,
    k_len: int,
    num_heads: int,
    head_dim: int,
    causal: bool,
    base_scale: jax.Array | float | None = None,
) -> jax.Array:
    """The policy's multiplier as a [Tq, H] float32 array."""
    if base_scale is None:
        base_scale = policy.base_scale(head_dim)
    ctx = ScaleContext(
        head_dim=head_dim,
        base_scale=jnp.asarray(base_scale, jnp.float32),
        num_keys=_keys_per_query(q_len, k_len, causal),
    )
    return jnp.broadcast_to(policy.scale(params, ctx), (q_len, num_heads)).astype(jnp.float32)


def fused_unsupported_reason(
    policy: ScalePolicy, *, dtype, logits_dtype, dropout: bool
) -> str | None:
    """Why the fused kernel cannot compute this attention, or None if it can."""
    if policy.transform_logits is not None:
        return "the policy transforms the raw logits, which the fused kernel never exposes"
    if dropout:
        return "jax.nn.dot_product_attention has no attention dropout"
    if logits_dtype is None and jnp.dtype(dtype) != jnp.float32:
        return "logits in the activation dtype need the reference path (the kernel picks its own)"
    return None


def fused_implementation(dtype, head_dim: int) -> str | None:
    """'cudnn' on NVIDIA GPUs for bf16/fp16 shapes cuDNN accepts, else None (XLA)."""
    device = jax.devices()[0]
    if device.platform != "gpu" or jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
        return None
    hopper = any(name in device.device_kind for name in ("H100", "H200", "H800", "GH200"))
    if head_dim % 8 or head_dim > (256 if hopper else 128):
        _warn_once(f"cuDNN attention needs head_dim % 8 == 0 and <= 128/256; head_dim={head_dim}: "
                   "using the XLA implementation")
        return None
    return "cudnn"


def _fused(q, k, v, policy: ScalePolicy, params: Params, *, causal: bool, base_scale):
    """`jax.nn.dot_product_attention` with the policy's multiplier folded into q."""
    _, q_len, num_heads, head_dim = q.shape
    k_len = k.shape[1]
    q, k = policy.transform_qk(params, q, k)
    scale = query_scale(policy, params, q_len=q_len, k_len=k_len, num_heads=num_heads,
                        head_dim=head_dim, causal=causal, base_scale=base_scale)
    q_scaled = (q.astype(jnp.float32) * scale[None, :, :, None]).astype(q.dtype)
    if causal and q_len != k_len:
        # jax's is_causal aligns query 0 with key 0; ours puts the last query on the last
        # key (`causal_mask`), so pass the mask itself, on the XLA path.
        return jax.nn.dot_product_attention(
            q_scaled, k, v, scale=1.0, mask=causal_mask(q_len, k_len)[None, None]
        )
    return jax.nn.dot_product_attention(
        q_scaled, k, v, scale=1.0, is_causal=causal,
        implementation=fused_implementation(q.dtype, head_dim),
    )


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    policy: ScalePolicy,
    params: Params = None,
    causal: bool = True,
    base_scale: jax.Array | float | None = None,
    logits_dtype=jnp.float32,
    implementation: str = "reference",
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    return_internals: bool = False,
) -> jax.Array | tuple[jax.Array, AttentionInternals]:
    """softmax(policy(q·k)) v over [batch, seq, heads, head_dim] arrays.

    base_scale: the policy's plain number as a (possibly traced) array; default
        `policy.base_scale(head_dim)` as a constant.
    logits_dtype: dtype of the logits and softmax (float32 by default); None keeps the
        activation dtype, to reproduce the mixed-precision overflow of the article's pitfall 3.
    implementation: "reference" or "fused"; fused falls back to reference (warning once) when
        the combination is unsupported, and always when internals are requested.
    """
    if params is None:
        params = {}
    _, q_len, num_heads, head_dim = q.shape
    k_len = k.shape[1]
    dropout = dropout_rate > 0.0 and dropout_key is not None
    if implementation not in ("reference", "fused"):
        raise ValueError(f"implementation must be 'reference' or 'fused', got {implementation!r}")
    if implementation == "fused" and not return_internals:
        reason = fused_unsupported_reason(
            policy, dtype=q.dtype, logits_dtype=logits_dtype, dropout=dropout
        )
        if reason is None:
            return _fused(q, k, v, policy, params, causal=causal, base_scale=base_scale)
        _warn_once(f"fused attention unavailable ({reason}); using the reference path")

    q, k = policy.transform_qk(params, q, k)
    compute_dtype = logits_dtype or q.dtype
    scale = query_scale(policy, params, q_len=q_len, k_len=k_len, num_heads=num_heads,
                        head_dim=head_dim, causal=causal, base_scale=base_scale)
    drop = (dropout_rate, dropout_key) if dropout else None
    if (causal and q_len == k_len and q_len >= 2 * CAUSAL_BLOCK and q_len % CAUSAL_BLOCK == 0
            and not return_internals and policy.transform_logits is None):
        return _causal_blocks(q, k, v, scale, compute_dtype, drop)
    mask = causal_mask(q_len, k_len) if causal else None
    out, logits, probs = _softmax_attention(q, k, v, scale, mask, compute_dtype, drop,
                                            policy.transform_logits)
    if return_internals:
        return out, AttentionInternals(logits=logits, probs=probs, mask=mask)
    return out


# Causal attention in query blocks of this size: block i attends to keys [0, (i+1)·block) only,
# so the masked upper triangle is mostly never computed (10 of 16 block pairs at 4 blocks).
CAUSAL_BLOCK = 64


def _causal_blocks(q, k, v, scale, compute_dtype, drop) -> jax.Array:
    seq = q.shape[1]
    outs = []
    for index, start in enumerate(range(0, seq, CAUSAL_BLOCK)):
        stop = start + CAUSAL_BLOCK
        block_drop = drop and (drop[0], jax.random.fold_in(drop[1], index))
        out, _, _ = _softmax_attention(
            q[:, start:stop], k[:, :stop], v[:, :stop],  # (B, blk, H, D), (B, stop, H, D)
            scale[start:stop], causal_mask(CAUSAL_BLOCK, stop), compute_dtype, block_drop, None)
        outs.append(out)
    return jnp.concatenate(outs, axis=1)  # (B, T, H, D)


def _softmax_attention(q, k, v, scale, mask, compute_dtype, drop, transform_logits):
    """softmax(scale · q·k) v with the mask; returns (out, post-scale logits, probs)."""
    logits = jnp.einsum(
        "bqhd,bkhd->bhqk", q, k, preferred_element_type=compute_dtype
    ).astype(compute_dtype)  # [B, H, Tq, Tk]
    if transform_logits is not None:
        logits = transform_logits(logits, mask)
    logits = logits * scale.T[None, :, :, None].astype(compute_dtype)  # [Tq,H] -> [1,H,Tq,1]
    masked = logits if mask is None else jnp.where(mask, logits, jnp.finfo(compute_dtype).min)
    probs = jax.nn.softmax(masked, axis=-1)
    weights = probs
    if drop:
        rate, key = drop
        keep = jax.random.bernoulli(key, 1.0 - rate, probs.shape)
        weights = jnp.where(keep, probs / (1.0 - rate), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v), logits, probs


# --------------------------------------------------------------------------- NNX module


class ScaleValue(nnx.Variable):
    """A policy's plain number: part of the model state (traced, vmappable), never trained."""


def apply_rotary(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotary position embedding over head_dim (split-halves convention). x: [B, T, H, D]."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[:, None].astype(jnp.float32) * freqs  # [T, D/2]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).astype(x.dtype)


class SelfAttention(nnx.Module):
    """Multi-head self-attention whose logit scale is a `ScalePolicy`.

    head_dim is independent of d_model, so d_k can be swept at a fixed model width.
    """

    def __init__(self, model: ModelConfig, policy: ScalePolicy, *, rngs: nnx.Rngs):
        num_heads, head_dim = model.num_heads, model.head_dim
        inner = num_heads * head_dim
        # The q/k gain is the article's pitfall 1: it changes Var(q·k) by gain⁴.
        qk_init, other_init = kernel_init(model.init, model.init_gain), kernel_init(model.init)
        # The output projection writes into the residual stream (GPT-2 scales it by depth).
        out_init = kernel_init(model.init, residual_layers=model.num_layers)
        use_bias = model.init == "gpt2"  # GPT-2's projections have (zero-initialised) biases

        def linear(fan_in, fan_out, init):
            return nnx.Linear(fan_in, fan_out, use_bias=use_bias, kernel_init=init,
                              dtype=model.compute_dtype, rngs=rngs)

        self.query = linear(model.d_model, inner, qk_init)
        self.key = linear(model.d_model, inner, qk_init)
        self.value = linear(model.d_model, inner, other_init)
        self.out = linear(inner, model.d_model, out_init)
        self.policy = policy
        self.policy_params = nnx.Param(
            policy.init(rngs.params(), num_heads=num_heads, head_dim=head_dim)
        )
        self.base_scale = ScaleValue(jnp.float32(policy.base_scale(head_dim)))
        self.num_heads, self.head_dim = num_heads, head_dim
        self.attention_dropout = model.attention_dropout
        self.logits_dtype = model.attention_logits_dtype
        self.rotary = model.positions == "rotary"
        self.attention_impl = model.attention_impl

    def __call__(
        self,
        x: jax.Array,
        *,
        dropout_key: jax.Array | None = None,
        with_diagnostics: bool = False,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        batch, seq, _ = x.shape
        split = (batch, seq, self.num_heads, self.head_dim)
        q = self.query(x).reshape(split)  # (B, T, H, D)
        k = self.key(x).reshape(split)
        v = self.value(x).reshape(split)
        if self.rotary:
            positions = jnp.arange(seq)
            q, k = apply_rotary(q, positions), apply_rotary(k, positions)
        params = self.policy_params.get_value()
        result = attend(
            q, k, v,
            policy=self.policy,
            params=params,
            causal=True,
            base_scale=self.base_scale[...],
            logits_dtype=self.logits_dtype,
            implementation=self.attention_impl,
            dropout_rate=self.attention_dropout,
            dropout_key=dropout_key,
            return_internals=with_diagnostics,
        )
        stats = None
        if with_diagnostics:
            result, internals = result
            stats = diagnostics.attention_stats(internals.logits, internals.probs, internals.mask)
            learned = self.policy.learned_values
            if learned is not None:
                for name, value in learned(params).items():
                    stats[f"learned_{name}"] = jnp.broadcast_to(value, (self.num_heads,))
        out = self.out(result.reshape(batch, seq, self.num_heads * self.head_dim))  # (B, T, C)
        return out, stats

