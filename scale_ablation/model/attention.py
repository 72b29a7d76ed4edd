"""Attention with a pluggable scale policy: the functional `attend` and the NNX module on top.

Layout throughout is the `jax.nn.dot_product_attention` one: [batch, seq, heads, head_dim].
Two backends compute the same function:
- "reference": explicit logits and softmax in XLA; the only path that can return the
  probabilities (diagnostics), apply attention dropout or a policy's logit transforms (soft-cap,
  LayerNorm of the logits) and weights in place of the softmax (sigmoid, sink).
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

from scale_ablation.model import blocked_attention, diagnostics, umup
from scale_ablation.model.initializers import kernel_init
from scale_ablation.model.policies import Params, ScaleContext, ScalePolicy, softmax_weights
from scale_ablation.model.spec import ModelConfig

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logging.warning(message)


@dataclasses.dataclass(frozen=True)
class AttentionInternals:
    """What the reference path can expose, for diagnostics."""

    logits: jax.Array  # [B, H, Tq, Tk] what enters the softmax (post-scale, post-cap), pre-mask
    probs: jax.Array  # [B, H, Tq, Tk] the weights on v
    mask: jax.Array | None  # [Tq, Tk] bool, True where a query may look
    # [H] float32: each head's largest post-scale logit over visible keys, before any post-scale
    # transform (the logit QK-clip bounds; MuonClip's S_max).
    max_logit: jax.Array | None = None


def causal_mask(q_len: int, k_len: int) -> jax.Array:
    """[Tq, Tk] bool; query i sits at key position i + (Tk - Tq)."""
    return jnp.tril(jnp.ones((q_len, k_len), bool), k=k_len - q_len)


def _keys_per_query(q_len: int, k_len: int, causal: bool) -> jax.Array:
    if causal:
        return jnp.arange(1, q_len + 1, dtype=jnp.float32) + (k_len - q_len)
    return jnp.full((q_len,), k_len, jnp.float32)


def _query_positions(q_len: int, k_len: int) -> jax.Array:
    """[Tq] float32: query i sits at position i + (Tk - Tq), as in `causal_mask`."""
    return jnp.arange(q_len, dtype=jnp.float32) + (k_len - q_len)


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
        positions=_query_positions(q_len, k_len),
    )
    return jnp.broadcast_to(policy.scale(params, ctx), (q_len, num_heads)).astype(jnp.float32)


def fused_unsupported_reason(
    policy: ScalePolicy, *, dtype, precision: tuple, dropout: bool,
    widths: tuple[int, int] | None = None,
) -> str | None:
    """Why the fused kernel cannot compute this attention, or None if it can.
    precision: (q·k product dtype, softmax input dtype), as `precisions` gives them; widths:
    (q/k width, value width) per head, which the kernel needs equal."""
    if widths is not None and widths[0] != widths[1]:
        return f"q/k width {widths[0]} differs from the value width {widths[1]}"
    reason = policy.fused_unsupported()
    if reason is not None:
        return f"the policy cannot be fused: {reason}"
    if dropout:
        return "jax.nn.dot_product_attention has no attention dropout"
    if any(jnp.dtype(switch) != jnp.float32 for switch in precision):
        return "logits in the activation dtype need the reference path (the kernel picks its own)"
    return None


def precisions(dtype, logits_dtype, qk_product_dtype, softmax_dtype) -> tuple:
    """(q·k product dtype, softmax input dtype) as dtypes; `logits_dtype` (the single switch of
    configs before the two were apart) is the default of either; None is the activation dtype."""
    product = logits_dtype if qk_product_dtype is SAME_AS_LOGITS else qk_product_dtype
    softmax = logits_dtype if softmax_dtype is SAME_AS_LOGITS else softmax_dtype
    return (product or dtype, softmax or dtype)


SAME_AS_LOGITS = "same as logits_dtype"  # the default of attend's two precision switches


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
    qk_product_dtype=SAME_AS_LOGITS,
    softmax_dtype=SAME_AS_LOGITS,
    implementation: str = "reference",
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    return_internals: bool = False,
) -> jax.Array | tuple[jax.Array, AttentionInternals]:
    """softmax(policy(q·k)) v over [batch, seq, heads, head_dim] arrays (v may be narrower).

    base_scale: the policy's plain number as a (traced) array; default its base_scale(d_k).
    logits_dtype: the logits' and softmax's dtype; None keeps the activations' (pitfall 3).
    qk_product_dtype, softmax_dtype: the two apart (MaxText's `float32_qk_product`,
        `float32_logits`); each defaults to `logits_dtype`.
    implementation: "reference"; "fused" (`jax.nn.dot_product_attention`) or "blocked"
        (`blocked_attention`), each falling back to reference, warning once, where unsupported
        or internals are asked for; "auto": blocked where it applies and was measured faster.
    """
    if params is None:
        params = {}
    _, q_len, num_heads, head_dim = q.shape
    k_len = k.shape[1]
    dropout = dropout_rate > 0.0 and dropout_key is not None
    _check_implementation(implementation)
    precision = precisions(q.dtype, logits_dtype, qk_product_dtype, softmax_dtype)
    if implementation == "fused" and not return_internals:
        reason = fused_unsupported_reason(policy, dtype=q.dtype, precision=precision,
                                          dropout=dropout, widths=(head_dim, v.shape[-1]))
        if reason is None:
            return _fused(q, k, v, policy, params, causal=causal, base_scale=base_scale)
        _warn_once(f"fused attention unavailable ({reason}); using the reference path")

    q, k = policy.transform_qk(params, q, k)
    scale = query_scale(policy, params, q_len=q_len, k_len=k_len, num_heads=num_heads,
                        head_dim=head_dim, causal=causal, base_scale=base_scale)
    if (out := blocked_attention.try_blocked(
            implementation, policy, q, k, v, scale, causal=causal, precision=precision,
            dropout=dropout, return_internals=return_internals, warn=_warn_once)) is not None:
        return out
    dense = _Dense(policy, params, precision, (dropout_rate, dropout_key) if dropout else None,
                   seq_len=k_len)
    if (causal and q_len == k_len and q_len >= 2 * CAUSAL_BLOCK and q_len % CAUSAL_BLOCK == 0
            and not return_internals and policy.transform_logits is None):
        return _causal_blocks(q, k, v, scale, dense)
    mask = causal_mask(q_len, k_len) if causal else None
    out, logits, probs, max_logit = dense(q, k, v, scale, mask)
    if return_internals:
        return out, AttentionInternals(logits=logits, probs=probs, mask=mask, max_logit=max_logit)
    return out


def _check_implementation(implementation: str) -> None:
    if implementation not in ("reference", "fused", *blocked_attention.IMPLEMENTATIONS):
        raise ValueError("implementation must be 'reference', 'fused', 'blocked' or 'auto', "
                         f"got {implementation!r}")


# Causal attention in query blocks of this size: block i attends to keys [0, (i+1)·block) only,
# so the masked upper triangle is mostly never computed (10 of 16 block pairs at 4 blocks).
CAUSAL_BLOCK = 64


def _causal_blocks(q, k, v, scale, dense: _Dense) -> jax.Array:
    seq = q.shape[1]
    outs = []
    for index, start in enumerate(range(0, seq, CAUSAL_BLOCK)):
        stop = start + CAUSAL_BLOCK
        block = dense.for_block(index)
        out, _, _, _ = block(
            q[:, start:stop], k[:, :stop], v[:, :stop],  # (B, blk, H, D), (B, stop, H, D)
            scale[start:stop], causal_mask(CAUSAL_BLOCK, stop))
        outs.append(out)
    return jnp.concatenate(outs, axis=1)  # (B, T, H, D)


@dataclasses.dataclass(frozen=True)
class _Dense:
    """The reference path's attention with a policy's logit stages, in its two dtypes."""

    policy: ScalePolicy
    params: Params
    precision: tuple  # (q·k product dtype, softmax input dtype)
    drop: tuple | None  # (rate, key) or None
    seq_len: int  # keys of the whole attention (a block sees fewer): sigmoid's T

    def for_block(self, index: int) -> _Dense:
        drop = self.drop and (self.drop[0], jax.random.fold_in(self.drop[1], index))
        return dataclasses.replace(self, drop=drop)

    def __call__(self, q, k, v, scale, mask):
        """(out, logits entering the weights, weights, [H] largest post-scale logit)."""
        product, softmax = self.precision
        policy = self.policy
        logits = jnp.einsum(
            "bqhd,bkhd->bhqk", q, k, preferred_element_type=product
        ).astype(product)  # [B, H, Tq, Tk]
        if policy.transform_logits is not None:
            logits = policy.transform_logits(logits, mask)
        logits = logits * scale.T[None, :, :, None].astype(product)  # [Tq,H] -> [1,H,Tq,1]
        visible = logits if mask is None else jnp.where(mask, logits, -jnp.inf)
        max_logit = jax.lax.stop_gradient(visible.max(axis=(0, 2, 3)).astype(jnp.float32))
        logits = logits.astype(softmax)
        if policy.transform_scaled is not None:
            logits = policy.transform_scaled(logits)
        probs = (policy.weights or softmax_weights)(self.params, logits, mask, self.seq_len)
        weights = probs
        if self.drop:
            rate, key = self.drop
            keep = jax.random.bernoulli(key, 1.0 - rate, probs.shape)
            weights = jnp.where(keep, probs / (1.0 - rate), 0.0)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)
        return out, logits, probs, max_logit


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


class MaxLogit(nnx.Variable):
    """QK-clip's record: each head's largest logit in the last train step's forward pass,
    [heads] float32 (model state, never trained; written by the train step, logged)."""


class ClipCount(nnx.Variable):
    """QK-clip's count of each head's clipped train steps, all of them, [heads] float32."""


class SelfAttention(nnx.Module):
    """Multi-head self-attention whose logit scale is a `ScalePolicy`.

    head_dim (the value/output width per head) is independent of d_model, so d_k can be swept at
    a fixed model width; q and k have their own per-head width `model.qk_dim` (default: head_dim),
    the d_k every policy sees, so a d_k arm can grow q and k only.
    """

    def __init__(self, model: ModelConfig, policy: ScalePolicy, *, rngs: nnx.Rngs,
                 layer: int = 0):
        num_heads, head_dim, qk_dim = model.num_heads, model.head_dim, model.qk_width
        inner, qk_inner = num_heads * head_dim, num_heads * qk_dim
        # The q/k gain is the article's pitfall 1: it changes Var(q·k) by gain⁴.
        qk_init, other_init = kernel_init(model.init, model.init_gain), kernel_init(model.init)
        # The output projection writes into the residual stream (GPT-2 scales it by depth).
        out_init = kernel_init(model.init, residual_layers=model.num_layers)
        use_bias = model.init == "gpt2"  # GPT-2's projections have (zero-initialised) biases

        def linear(fan_in, fan_out, init):  # u-μP's unit-scaled one under umup (umup.py)
            return umup.linear(model, fan_in, fan_out, init, use_bias=use_bias, rngs=rngs)

        self.query = linear(model.d_model, qk_inner, qk_init)
        self.key = linear(model.d_model, qk_inner, qk_init)
        self.value = linear(model.d_model, inner, other_init)
        self.out = linear(inner, model.d_model, out_init)
        self.policy = policy
        self.policy_params = nnx.Param(
            policy.init(rngs.params(), num_heads=num_heads, head_dim=qk_dim)
        )
        self.base_scale = ScaleValue(jnp.float32(model.base_scale(policy, layer)))
        if policy.qk_clip is not None:
            self.max_logit = MaxLogit(jnp.zeros((num_heads,), jnp.float32))
            self.clip_count = ClipCount(jnp.zeros((num_heads,), jnp.float32))
        self.num_heads, self.head_dim, self.qk_dim = num_heads, head_dim, qk_dim
        self.attention_dropout = model.attention_dropout
        # attend's keywords: the dtypes of the q·k product and of the softmax input.
        self.precision = tuple(model.attention_precision.items())  # hashable: graphdef static
        self.rotary = model.positions == "rotary"
        self.attention_impl = model.attention_impl
        self.unit_scaled = umup.is_on(model)  # u-μP's rescaled output

    def __call__(
        self,
        x: jax.Array,
        *,
        dropout_key: jax.Array | None = None,
        with_diagnostics: bool = False,
        sow_max_logit: bool = False,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        """sow_max_logit: under QK-clip, sow this forward pass's largest logit per head as the
        `nnx.Intermediate` "step_max_logit", for the train step's `nnx.capture`
        (`qk_clip.forward`); asked for only there, since a sow outside a capture is
        deprecated."""
        batch, seq, _ = x.shape
        qk_split = (batch, seq, self.num_heads, self.qk_dim)
        q = self.query(x).reshape(qk_split)  # (B, T, H, D_qk)
        k = self.key(x).reshape(qk_split)
        v = self.value(x).reshape(batch, seq, self.num_heads, self.head_dim)  # (B, T, H, D)
        if self.rotary:
            positions = jnp.arange(seq)
            q, k = apply_rotary(q, positions), apply_rotary(k, positions)
        params = self.policy_params.get_value()
        clip = self.policy.qk_clip is not None and sow_max_logit  # the train step's pass
        result = attend(
            q, k, v,
            policy=self.policy,
            params=params,
            causal=True,
            base_scale=self.base_scale[...],
            **dict(self.precision),
            implementation=self.attention_impl,
            dropout_rate=self.attention_dropout,
            dropout_key=dropout_key,
            # QK-clip reads each head's largest logit off the dense path's logits: no extra pass.
            return_internals=with_diagnostics or clip,
        )
        if with_diagnostics or clip:
            result, internals = result
        stats = self._stats(internals, params) if with_diagnostics else None
        if clip:  # the record (`MaxLogit`) is set by `qk_clip.after_step`
            self.sow(nnx.Intermediate, "step_max_logit", internals.max_logit)
        if self.unit_scaled:  # × 1/σ of the output at its (traced) logit scale
            result = umup.rescale_attention(result, self.base_scale[...], self.qk_dim)
        out = self.out(result.reshape(batch, seq, self.num_heads * self.head_dim))  # (B, T, C)
        return out, stats

    def _stats(self, internals: AttentionInternals, params: Params) -> dict[str, jax.Array]:
        """The diagnostics of one forward pass, the policy's learned values, a soft-cap's share of
        logits past its knee and QK-clip's `MaxLogit` (the last train step's) and `ClipCount`."""
        stats = diagnostics.attention_stats(internals.logits, internals.probs, internals.mask)
        if (cap := self.policy.soft_cap) is not None:
            stats["softcap_past_knee"] = diagnostics.past_knee(internals.logits, internals.mask,
                                                               cap)
        learned = self.policy.learned_values
        if learned is not None:
            for name, value in learned(params).items():
                stats[f"learned_{name}"] = jnp.broadcast_to(value, (self.num_heads,))
        if self.policy.qk_clip is not None:
            stats["qk_clip_max_logit"] = self.max_logit.get_value()
            stats["qk_clip_clipped_steps"] = self.clip_count.get_value()
        return stats

