"""Attention health: pure functions of post-scale logits and attention probabilities.

Everything is reduced per head over batch and queries, masked to the keys each query can see.
The health bands are the article's §5.2/§6.5 rules of thumb; they are flags to log, not truths.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

LOGIT_STD_BAND = (0.8, 1.2)
MAX_WEIGHT_LIMIT = 0.7
PEAKED_WEIGHT = 0.9


def attention_stats(
    logits: jax.Array, probs: jax.Array, mask: jax.Array | None
) -> dict[str, jax.Array]:
    """Per-head statistics, each a [heads] float32 array.

    Queries that see one key (the first query under a causal mask) have no choice: their weight
    is always 1 and their entropy 0. They are left out of `entropy_normalised`, `max_weight`
    and `peaked_share` (means over the queries that see two keys or more); `entropy` is the
    plain mean over every query, in nats.

    logits: [B, H, Tq, Tk] after the policy's scale, before masking.
    probs:  [B, H, Tq, Tk] softmax weights.
    mask:   [Tq, Tk] bool (True = visible) or None for full attention.
    """
    logits = logits.astype(jnp.float32)
    probs = probs.astype(jnp.float32)
    if mask is None:
        mask = jnp.ones(logits.shape[-2:], bool)
    visible = jnp.broadcast_to(mask, logits.shape)
    count = visible.sum(axis=(0, 2, 3))  # [H]
    mean = jnp.where(visible, logits, 0).sum(axis=(0, 2, 3)) / count
    centred = jnp.where(visible, logits - mean[None, :, None, None], 0)
    logit_std = jnp.sqrt((centred**2).sum(axis=(0, 2, 3)) / count)
    max_abs_logit = jnp.where(visible, jnp.abs(logits), 0).max(axis=(0, 2, 3))
    # μP's coordinate size of the logits (the coordinate check, `LanguageModel.coordinates`).
    mean_abs_logit = jnp.where(visible, jnp.abs(logits), 0).sum(axis=(0, 2, 3)) / count

    entropy = -(jnp.where(visible, probs * jnp.log(jnp.maximum(probs, 1e-30)), 0)).sum(-1)  # [B,H,Tq]
    keys_seen = mask.sum(-1).astype(jnp.float32)  # [Tq]
    # A query that sees one key has no choice to make: leave it out of the normalised entropy.
    has_choice = keys_seen > 1
    normalised = entropy / jnp.log(jnp.where(has_choice, keys_seen, 2.0))
    max_weight = probs.max(-1)  # [B, H, Tq]

    def over_queries(x, where=None):
        if where is None:
            return x.mean(axis=(0, 2))
        w = jnp.broadcast_to(where, x.shape)
        return jnp.where(w, x, 0).sum(axis=(0, 2)) / jnp.maximum(w.sum(axis=(0, 2)), 1)

    return {
        "logit_std": logit_std,
        "max_abs_logit": max_abs_logit,
        "mean_abs_logit": mean_abs_logit,
        "entropy": over_queries(entropy),
        "entropy_normalised": over_queries(normalised, has_choice),
        "max_weight": over_queries(max_weight, has_choice),
        "peaked_share": over_queries((max_weight > PEAKED_WEIGHT).astype(jnp.float32), has_choice),
    }


def past_knee(capped: jax.Array, mask: jax.Array | None, cap: float) -> jax.Array:
    """[H] float32: the share of visible logits a soft-cap C·tanh(z / C) took past its knee,
    |z| > C/2, where it bends a logit by 7.6% or more (1 − tanh(½)/½). `capped` are the logits
    after the cap [B, H, Tq, Tk] (what the diagnostics see); |z| > C/2 is |capped| > C·tanh(½),
    since tanh is monotone."""
    capped = jnp.abs(capped.astype(jnp.float32))
    if mask is None:
        mask = jnp.ones(capped.shape[-2:], bool)
    visible = jnp.broadcast_to(mask, capped.shape)
    past = visible & (capped > cap * math.tanh(0.5))
    return past.sum(axis=(0, 2, 3)) / visible.sum(axis=(0, 2, 3))


def health_flags(stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Booleans per head: True where the article's health band is violated."""
    low, high = LOGIT_STD_BAND
    return {
        "logit_std_out_of_band": (stats["logit_std"] < low) | (stats["logit_std"] > high),
        "max_weight_too_high": stats["max_weight"] > MAX_WEIGHT_LIMIT,
    }


def summarise_layer(stats: dict[str, jax.Array], prefix: str) -> dict[str, jax.Array]:
    """Flat metrics for logging: per-layer head means (max for max_abs_logit and QK-clip's
    clipped steps), per-head values,
    and the share of heads outside each health band."""
    out: dict[str, jax.Array] = {}
    for name, per_head in stats.items():
        # Maxima stay maxima; a layer's clip count is its most-clipped head's.
        reduce = jnp.max if name in ("max_abs_logit", "qk_clip_clipped_steps") else jnp.mean
        out[f"{prefix}/{name}"] = reduce(per_head)
        for head in range(per_head.shape[0]):
            out[f"{prefix}/head{head}/{name}"] = per_head[head]
    for name, flag in health_flags(stats).items():
        out[f"{prefix}/{name}"] = flag.astype(jnp.float32).mean()
    return out


def softmax_entropy_table(
    rng: jax.Array, *, head_dim: int, divisor: float, n_keys: int, n_samples: int
) -> tuple[float, float]:
    """The article's §3 Monte Carlo: mean entropy and max weight of softmax(q·k / divisor)
    for q and keys drawn i.i.d. from N(0, 1)."""
    q_rng, k_rng = jax.random.split(rng)
    q = jax.random.normal(q_rng, (n_samples, head_dim))
    keys = jax.random.normal(k_rng, (n_samples, n_keys, head_dim))
    probs = jax.nn.softmax(jnp.einsum("sd,skd->sk", q, keys) / divisor, axis=-1)
    entropy = -(probs * jnp.log(jnp.maximum(probs, 1e-30))).sum(-1)
    return float(entropy.mean()), float(probs.max(-1).mean())
