"""Causal self-attention over blocks at or below the diagonal, with an online softmax.

The sequence is cut into blocks of `block_size` (the last one zero-padded). Query block i only
ever meets key blocks 0..i: the upper triangle of the causal product is never computed, so a
sequence of n blocks costs n(n+1)/2 block products where the dense path costs n². Each query
block's softmax is computed online across its key blocks with a running max and a running sum
(Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; FlashAttention, Dao et
al. 2022). The key blocks are swept by their offset d below the diagonal: at offset d every query
block i ≥ d meets key block i − d in one batched product, so the program has n steps of large
matmuls rather than n(n+1)/2 small ones (XLA on a CPU runs few large products faster). The
(batch, head) pairs go GROUP_SIZE at a time (`lax.map`), so that a group's scores stay in cache.

The backward is its own (`jax.custom_vjp`): the forward keeps only its inputs, the output and the
per-query log-sum-exp; the backward recomputes each block's weights exp(s − lse) and forms
dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ = dS K, dK = dSᵀ Q (FlashAttention-2, Dao 2023,
algorithm 2), so the [T, T] weights are never stored.

Rules (`unsupported_reason` names the one that fails; `attention.attend` then keeps the dense
reference path):
- causal self-attention only (q_len == k_len): the only layout the LM uses;
- the policy's multiplier is folded into q (a [T, H] scale multiplies query rows, exactly as it
  multiplies logit rows), so only the policies the fused kernel could take qualify
  (`ScalePolicy.fused_unsupported`): one that transforms the raw or scaled logits, replaces the
  softmax or needs each head's largest logit (QK-clip) keeps the dense path;
- no attention dropout (its mask is drawn over the dense [T, T] weights; the blocked path would
  draw a different one), no internals for diagnostics (there are no stored probabilities), and
  float32 logits only (the activation-dtype logits of the article's pitfall 3 stay dense).
The arithmetic is float32 whatever the input dtype; the output has v's dtype, as on the dense path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from scale_ablation.model.policies import ScalePolicy

# Measured on the 2-core development CPU (benchmarks/attention_blocks.py: batch 16, 4 heads,
# head_dim 64, forward + backward; benchmarks/results/attention_blocks_*.json): blocks of 64 were
# faster at sequence 256, blocks of 128 at 1024, so the default is 64 below 512 and 128 from there.
SMALL_BLOCK, LARGE_BLOCK, LARGE_FROM = 64, 128, 512
# "auto" takes the blocked path from this sequence length on (the same benchmark; see
# `use_blocked`). Loaded (load 7-9 on the 2 cores) it beat the dense path from 256 and the
# query-blocked reference (attention.CAUSAL_BLOCK) from 384 on, 1.6x at 512 and at 1024; idle, an
# earlier version beat the dense path from 256 on but lost ~15% to the reference at 1024 (it
# recomputes the weights: 7 block products to the reference's 6). 512 is where it won clearly.
AUTO_MIN_SEQ = 512
# (batch, head) pairs computed together, one group after another: a group's [n, blk, blk] scores
# stay within a core's cache (4 and 1 were within the machine's noise of each other; 64 slower).
GROUP_SIZE = 4


def default_block_size(seq_len: int) -> int:
    """The measured block size for this length (`SMALL_BLOCK` below `LARGE_FROM`)."""
    return SMALL_BLOCK if seq_len < LARGE_FROM else LARGE_BLOCK


IMPLEMENTATIONS = ("blocked", "auto")  # the `attention_impl` values that may take this path


def unsupported_reason(
    policy: ScalePolicy,
    *,
    causal: bool,
    q_len: int,
    k_len: int,
    precision: tuple,
    dropout: bool,
    return_internals: bool,
) -> str | None:
    """Why the blocked path cannot compute this attention, or None if it can.

    precision: (q·k product dtype, softmax input dtype), as `attention.precisions` gives them.
    A policy qualifies exactly when the fused kernel could take it (`fused_unsupported`): both
    see nothing but q and k after the policy's q/k transform and multiplier are folded in.
    """
    if not causal or q_len != k_len:
        return "it computes causal self-attention only (q_len == k_len)"
    reason = policy.fused_unsupported()
    if reason is not None:
        return f"the policy needs the whole logits: {reason}"
    if dropout:
        return "attention dropout is drawn over the dense weights"
    if return_internals:
        return "diagnostics need the probabilities, which the blocked path never stores"
    if any(dtype is None or jnp.dtype(dtype) != jnp.float32 for dtype in precision):
        return "it computes float32 logits only"
    return None


def use_blocked(implementation: str, seq_len: int, reason: str | None) -> bool:
    """Whether `implementation` ("blocked" or "auto") takes the blocked path here.

    "blocked" takes it wherever it applies; "auto" only on a CPU from `AUTO_MIN_SEQ` on, the
    crossover measured there (elsewhere it has not been measured, so the dense path stays).
    """
    if reason is not None:
        return False
    if implementation == "blocked":
        return True
    return jax.devices()[0].platform == "cpu" and seq_len >= AUTO_MIN_SEQ


def blocked_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: jax.Array, *, block_size: int | None = None,
    group_size: int = GROUP_SIZE,
) -> jax.Array:
    """Causal softmax(scale · q·k) v over [B, T, H, D] arrays; scale: [T, H] per query and head.

    Gradients reach q, k, v and the scale (through the fold into q) by the custom backward.
    block_size: default `default_block_size(T)`; group_size: (batch, head) pairs per group.
    """
    batch, seq, heads, _ = q.shape
    if k.shape != q.shape or v.shape[:3] != q.shape[:3] or scale.shape != (seq, heads):
        raise ValueError(f"blocked attention needs q, k [B, T, H, D], v [B, T, H, Dv] and scale "
                         f"[T, H]; got {q.shape}, {k.shape}, {v.shape}, {scale.shape}")
    block = min(block_size or default_block_size(seq), seq)
    padded = -(-seq // block) * block
    q_scaled = q.astype(jnp.float32) * scale.astype(jnp.float32)[None, :, :, None]
    group = math.gcd(batch * heads, group_size)
    blocks = tuple(_to_blocks(x.astype(jnp.float32), block, padded, group) for x in (q_scaled, k, v))
    out = jax.lax.map(lambda qkv: _flash(*qkv), blocks)
    return _from_blocks(out, batch, seq).astype(v.dtype)


def _to_blocks(x: jax.Array, block: int, padded: int, group: int) -> jax.Array:
    batch, seq, heads, dim = x.shape
    x = jnp.pad(x, ((0, 0), (0, padded - seq), (0, 0), (0, 0)))  # zero rows past the end
    x = x.reshape(batch, padded // block, block, heads, dim)  # (B, n, blk, H, D)
    x = x.transpose(0, 3, 1, 2, 4)  # (B, H, n, blk, D)
    return x.reshape(batch * heads // group, group, padded // block, block, dim)  # (BH/G, G, n, blk, D)


def _from_blocks(x: jax.Array, batch: int, seq: int) -> jax.Array:
    _, _, num_blocks, block, dim = x.shape
    x = x.reshape(batch, -1, num_blocks, block, dim)  # (B, H, n, blk, D)
    x = x.transpose(0, 2, 3, 1, 4)  # (B, n, blk, H, D)
    return x.reshape(batch, num_blocks * block, -1, dim)[:, :seq]  # (B, T, H, D)


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
    return jnp.einsum("gnqd,gnkd->gnqk", q, k)  # (G, n-d, blk, blk)


def _diagonal_mask(block: int) -> jax.Array:
    return jnp.tril(jnp.ones((block, block), bool))  # query row i sees key columns 0..i


@jax.custom_vjp
def _flash(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return _flash_forward(q, k, v)[0]


def _flash_forward(q, k, v):
    """(out, lse): q, k, v [B, H, n, blk, D] (q already scaled); lse [B, H, n, blk]."""
    num_blocks, block = q.shape[1], q.shape[2]
    # Offset 0, the diagonal: every row sees at least its own key, so its max is finite.
    scores = jnp.where(_diagonal_mask(block), _scores(q, k), -jnp.inf)
    row_max = scores.max(-1)  # (G, n, blk)
    weights = jnp.exp(scores - row_max[..., None])
    row_sum = weights.sum(-1)
    acc = jnp.einsum("gnqk,gnkd->gnqd", weights, v)
    for offset in range(1, num_blocks):
        # Query blocks offset.. meet key blocks ..n-offset: below the diagonal, nothing masked.
        rows = slice(offset, None)
        scores = _scores(q[:, rows], k[:, : num_blocks - offset])
        old_max = row_max[:, rows]
        new_max = jnp.maximum(old_max, scores.max(-1))
        rescale = jnp.exp(old_max - new_max)  # what the running sums were measured against
        weights = jnp.exp(scores - new_max[..., None])
        row_sum = row_sum.at[:, rows].set(row_sum[:, rows] * rescale + weights.sum(-1))
        update = jnp.einsum("gnqk,gnkd->gnqd", weights, v[:, : num_blocks - offset])
        acc = acc.at[:, rows].set(acc[:, rows] * rescale[..., None] + update)
        row_max = row_max.at[:, rows].set(new_max)
    return acc / row_sum[..., None], row_max + jnp.log(row_sum)


def _flash_fwd(q, k, v):
    out, lse = _flash_forward(q, k, v)
    return out, (q, k, v, out, lse)


def _flash_bwd(residuals, d_out):
    q, k, v, out, lse = residuals
    num_blocks, block = q.shape[1], q.shape[2]
    delta = (d_out * out).sum(-1)  # rowsum(dO ∘ O) = rowsum(P ∘ dO Vᵀ): (G, n, blk)
    d_q, d_k, d_v = jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
    for offset in range(num_blocks):
        rows, cols = slice(offset, None), slice(None, num_blocks - offset)
        q_rows, d_out_rows = q[:, rows], d_out[:, rows]
        k_cols, v_cols = k[:, cols], v[:, cols]
        weights = jnp.exp(_scores(q_rows, k_cols) - lse[:, rows, :, None])
        if offset == 0:
            weights = jnp.where(_diagonal_mask(block), weights, 0.0)
        d_v = d_v.at[:, cols].add(jnp.einsum("gnqk,gnqd->gnkd", weights, d_out_rows))
        d_weights = jnp.einsum("gnqd,gnkd->gnqk", d_out_rows, v_cols)
        d_scores = weights * (d_weights - delta[:, rows, :, None])
        d_q = d_q.at[:, rows].add(jnp.einsum("gnqk,gnkd->gnqd", d_scores, k_cols))
        d_k = d_k.at[:, cols].add(jnp.einsum("gnqk,gnqd->gnkd", d_scores, q_rows))
    return d_q, d_k, d_v


_flash.defvjp(_flash_fwd, _flash_bwd)


def try_blocked(implementation: str, policy, q, k, v, scale, *, causal: bool, precision,
                dropout: bool, return_internals: bool,
                warn: Callable[[str], None]) -> jax.Array | None:
    """The blocked path's output where it applies (and, for "auto", was measured faster), else
    None; "blocked" asked for where it cannot run says why through `warn`."""
    if implementation not in IMPLEMENTATIONS:
        return None
    q_len, k_len = q.shape[1], k.shape[1]
    reason = unsupported_reason(
        policy, causal=causal, q_len=q_len, k_len=k_len, precision=precision,
        dropout=dropout, return_internals=return_internals)
    if use_blocked(implementation, q_len, reason):
        return blocked_attention(q, k, v, scale)
    if implementation == "blocked" and not return_internals:
        warn(f"blocked attention unavailable ({reason}); using the reference path")
    return None
