"""Attention health statistics on hand-built probabilities, against numpy over the visible
entries, the health bands, and the §3 Monte Carlo table against an independent numpy one."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scale_ablation.model import attention, diagnostics, policies


def causal(n):
    return np.tril(np.ones((n, n), bool))


def normal(seed, shape):
    # numpy, not jax.random: every new shape would compile a fresh PRNG program (~1 s on CPU).
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


# One compilation per shape instead of op-by-op dispatch of every reduction.
attention_stats = jax.jit(diagnostics.attention_stats)


def stats_of(logits, probs, mask):
    out = attention_stats(
        jnp.asarray(logits), jnp.asarray(probs), None if mask is None else jnp.asarray(mask)
    )
    return {name: np.asarray(value) for name, value in out.items()}


def test_uniform_rows_full_attention():
    batch, heads, n = 2, 3, 8
    probs = np.full((batch, heads, n, n), 1 / n, np.float32)
    stats = stats_of(np.zeros_like(probs), probs, None)
    np.testing.assert_allclose(stats["entropy"], math.log(n), rtol=1e-6)
    np.testing.assert_allclose(stats["entropy_normalised"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(stats["max_weight"], 1 / n, rtol=1e-6)
    np.testing.assert_array_equal(stats["peaked_share"], 0.0)
    for value in stats.values():
        assert value.shape == (heads,) and value.dtype == np.float32


def test_uniform_over_visible_keys_causal():
    batch, heads, n = 1, 2, 6
    mask = causal(n)
    row = mask / mask.sum(-1, keepdims=True)  # query i: 1/(i+1) on keys 0..i
    probs = np.broadcast_to(row, (batch, heads, n, n)).astype(np.float32)
    stats = stats_of(np.zeros_like(probs), probs, mask)
    seen = np.arange(1, n + 1)
    np.testing.assert_allclose(stats["entropy"], np.log(seen).mean(), rtol=1e-6)
    # Query 0 has one key and no choice: left out, every other query is at the maximum.
    np.testing.assert_allclose(stats["entropy_normalised"], 1.0, rtol=1e-6)
    # Query 0's weight is 1 whatever the scale: the max weight and the peaked share leave it out.
    np.testing.assert_allclose(stats["max_weight"], (1 / seen[1:]).mean(), rtol=1e-6)
    np.testing.assert_array_equal(stats["peaked_share"], 0.0)


def test_max_weight_leaves_out_the_query_that_sees_one_key():
    # Queries 1..n-1 put 0.95 on key 0; query 0 has weight 1 on its only key. Counted over the
    # queries with a choice the mean max weight is 0.95; with query 0 it would be 0.96.
    n = 5
    mask = causal(n)
    probs = np.zeros((1, 1, n, n), np.float32)
    probs[0, 0, 0, 0] = 1.0
    for query in range(1, n):
        probs[0, 0, query, 0] = 0.95
        probs[0, 0, query, 1 : query + 1] = 0.05 / query
    stats = stats_of(np.zeros_like(probs), probs, mask)
    np.testing.assert_allclose(stats["max_weight"], [0.95], rtol=1e-6)
    np.testing.assert_allclose(stats["peaked_share"], [1.0])
    probs[0, 0, 1:, 0] = 0.5  # queries 1..n-1 no longer peaked; query 0 still has weight 1
    probs[0, 0, 1, 1] = 0.5
    for query in range(2, n):
        probs[0, 0, query, 1 : query + 1] = 0.5 / query
    stats = stats_of(np.zeros_like(probs), probs, mask)
    np.testing.assert_allclose(stats["max_weight"], [0.5], rtol=1e-6)
    np.testing.assert_array_equal(stats["peaked_share"], [0.0])


def test_one_hot_rows():
    batch, heads, n = 2, 2, 5
    mask = causal(n)
    probs = np.zeros((batch, heads, n, n), np.float32)
    probs[..., np.arange(n), np.arange(n)] = 1.0  # each query on itself
    stats = stats_of(np.zeros_like(probs), probs, mask)
    np.testing.assert_array_equal(stats["entropy"], 0.0)
    np.testing.assert_array_equal(stats["entropy_normalised"], 0.0)
    np.testing.assert_array_equal(stats["max_weight"], 1.0)
    np.testing.assert_array_equal(stats["peaked_share"], 1.0)


def test_stats_are_per_head():
    n = 4
    probs = np.zeros((1, 2, n, n), np.float32)
    probs[0, 0] = 1 / n  # head 0 uniform
    probs[0, 1, :, 0] = 1.0  # head 1 one-hot
    stats = stats_of(np.zeros_like(probs), probs, None)
    np.testing.assert_allclose(stats["entropy"], [math.log(n), 0.0], atol=1e-6)
    np.testing.assert_allclose(stats["max_weight"], [1 / n, 1.0], rtol=1e-6)
    np.testing.assert_allclose(stats["peaked_share"], [0.0, 1.0])


def test_peaked_share_counts_rows_above_threshold():
    n = 4
    probs = np.zeros((1, 1, n, n), np.float32)
    probs[0, 0, 0] = [0.95, 0.05, 0, 0]
    probs[0, 0, 1] = [0.91, 0.03, 0.03, 0.03]
    probs[0, 0, 2] = [0.85, 0.05, 0.05, 0.05]
    probs[0, 0, 3] = 0.25
    stats = stats_of(np.zeros_like(probs), probs, None)
    np.testing.assert_allclose(stats["peaked_share"], [0.5])
    np.testing.assert_allclose(stats["max_weight"], [(0.95 + 0.91 + 0.85 + 0.25) / 4], rtol=1e-6)
    expected_entropy = np.mean([-(p[p > 0] * np.log(p[p > 0])).sum() for p in probs[0, 0]])
    np.testing.assert_allclose(stats["entropy"], [expected_entropy], rtol=1e-5)


@pytest.mark.parametrize("use_mask", [True, False])
def test_logit_std_and_max_abs_over_visible_entries(use_mask):
    batch, heads, n = 3, 2, 9
    rng = np.random.default_rng(0)
    logits = rng.normal(0.5, 2.0, (batch, heads, n, n)).astype(np.float32)
    mask = causal(n) if use_mask else None
    if use_mask:
        logits[..., ~mask] = 1e4  # hidden entries that must not count
    probs = np.full_like(logits, 1 / n)
    stats = stats_of(logits, probs, mask)
    for h in range(heads):
        per_head = logits[:, h].astype(np.float64)
        visible = per_head[:, mask] if use_mask else per_head.ravel()
        assert stats["logit_std"][h] == pytest.approx(visible.std(), rel=1e-4)
        assert stats["max_abs_logit"][h] == pytest.approx(np.abs(visible).max(), rel=1e-6)


def test_softmax_of_internals_matches_hand_computed_entropy():
    """On real attention internals: entropy against numpy over each query's visible keys."""
    q, k = normal(0, (2, 6, 2, 16)), normal(1, (2, 6, 2, 16))
    _, internals = attention.attend(q, k, k, policy=policies.get("none"), return_internals=True)
    stats = stats_of(internals.logits, internals.probs, internals.mask)
    logits = np.asarray(internals.logits, np.float64)
    for h in range(2):
        entropies, normalised = [], []
        for b in range(2):
            for i in range(6):
                row = logits[b, h, i, : i + 1]
                p = np.exp(row - row.max())
                p /= p.sum()
                entropy = -(p * np.log(np.maximum(p, 1e-300))).sum()
                entropies.append(entropy)
                if i > 0:
                    normalised.append(entropy / math.log(i + 1))
        assert stats["entropy"][h] == pytest.approx(np.mean(entropies), rel=1e-4, abs=1e-6)
        assert stats["entropy_normalised"][h] == pytest.approx(
            np.mean(normalised), rel=1e-4, abs=1e-6
        )


# --------------------------------------------------------------------------- health bands


def test_health_flags_bands():
    logit_std = np.array([0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 3.0], np.float32)
    max_weight = np.array([0.1, 0.5, 0.69, 0.71, 0.9, 1.0, 0.3], np.float32)
    flags = diagnostics.health_flags(
        {"logit_std": jnp.asarray(logit_std), "max_weight": jnp.asarray(max_weight)}
    )
    np.testing.assert_array_equal(
        flags["logit_std_out_of_band"], [True, True, False, False, False, True, True]
    )
    np.testing.assert_array_equal(
        flags["max_weight_too_high"], [False, False, False, True, True, True, False]
    )


def test_health_flags_on_real_attention():
    """Unit-variance q, k at d_k = 256: healthy under 1/√d_k, flagged without a divisor."""
    head_dim = 256
    q, k = normal(0, (4, 32, 2, head_dim)), normal(1, (4, 32, 2, head_dim))
    flags = {}
    for spec in ("inv_sqrt_dk", "none"):
        _, internals = attention.attend(q, k, k, policy=policies.get(spec), return_internals=True)
        stats = attention_stats(internals.logits, internals.probs, internals.mask)
        flags[spec] = {name: np.asarray(f) for name, f in diagnostics.health_flags(stats).items()}
    assert not flags["inv_sqrt_dk"]["logit_std_out_of_band"].any()
    assert flags["none"]["logit_std_out_of_band"].all()
    assert flags["none"]["max_weight_too_high"].all()


def test_summarise_layer():
    stats = {
        "logit_std": jnp.array([0.5, 1.0]),
        "max_abs_logit": jnp.array([3.0, 7.0]),
        "max_weight": jnp.array([0.2, 0.9]),
    }
    summary = {k: float(v) for k, v in diagnostics.summarise_layer(stats, "layer0").items()}
    assert summary["layer0/logit_std"] == pytest.approx(0.75)
    assert summary["layer0/max_abs_logit"] == pytest.approx(7.0)  # worst head, not the mean
    assert summary["layer0/head1/max_weight"] == pytest.approx(0.9)
    assert summary["layer0/logit_std_out_of_band"] == pytest.approx(0.5)
    assert summary["layer0/max_weight_too_high"] == pytest.approx(0.5)


# --------------------------------------------------------------------------- §3 Monte Carlo


def numpy_entropy_table(seed, *, head_dim, divisor, n_keys, n_samples):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_samples, head_dim))
    keys = rng.standard_normal((n_samples, n_keys, head_dim))
    logits = np.einsum("sd,skd->sk", q, keys) / divisor
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    entropy = -(p * np.log(np.maximum(p, 1e-300))).sum(-1)
    return entropy.mean(), p.max(-1).mean()


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("divisor_name", ["1", "sqrt_dk", "10"])
def test_softmax_entropy_table_matches_numpy_monte_carlo(head_dim, divisor_name):
    divisor = {"1": 1.0, "sqrt_dk": math.sqrt(head_dim), "10": 10.0}[divisor_name]
    args = {"head_dim": head_dim, "divisor": divisor, "n_keys": 3, "n_samples": 10_000}
    entropy, max_weight = diagnostics.softmax_entropy_table(jax.random.key(0), **args)
    ref_entropy, ref_max_weight = numpy_entropy_table(0, **args)
    assert entropy == pytest.approx(ref_entropy, abs=0.02)
    assert max_weight == pytest.approx(ref_max_weight, abs=0.02)


def test_softmax_entropy_table_limits():
    # A huge divisor flattens the softmax: entropy ln 3, weights 1/3.
    entropy, max_weight = diagnostics.softmax_entropy_table(
        jax.random.key(0), head_dim=64, divisor=1e6, n_keys=3, n_samples=10_000
    )
    assert entropy == pytest.approx(math.log(3), rel=1e-4)
    assert max_weight == pytest.approx(1 / 3, rel=1e-4)
    # No divisor at d_k = 1024 saturates it: near one-hot (the article's §2.2).
    entropy, max_weight = diagnostics.softmax_entropy_table(
        jax.random.key(0), head_dim=1024, divisor=1.0, n_keys=3, n_samples=2000
    )
    assert entropy < 0.1 and max_weight > 0.95


@pytest.mark.parametrize("use_mask", [False, True])
def test_past_knee_counts_capped_logits_beyond_half_the_cap(use_mask):
    cap, (batch, heads, n) = 4.0, (2, 3, 6)
    raw = 3 * np.asarray(normal(7, (batch, heads, n, n)))
    capped = cap * np.tanh(raw / cap)
    mask = causal(n) if use_mask else np.ones((n, n), bool)
    # Counted on the raw logits: |z| > C/2 among the visible ones, per head.
    expected = [((np.abs(raw[:, h]) > cap / 2) & mask).sum() / (batch * mask.sum())
                for h in range(heads)]
    got = diagnostics.past_knee(jnp.asarray(capped), jnp.asarray(mask) if use_mask else None, cap)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)


def test_a_softcap_layer_reports_its_share_past_the_knee():
    from flax import nnx

    from scale_ablation.model.spec import ModelConfig

    model = ModelConfig(d_model=32, num_layers=1, num_heads=2, head_dim=16,
                        layer_policies=("softcap:0.5",))
    model.check()
    layer = attention.SelfAttention(model, policies.get("softcap:0.5"), rngs=nnx.Rngs(0))
    x = 4 * normal(1, (1, 8, 32))
    _, stats = layer(x, with_diagnostics=True)
    # The raw logits by hand from the layer's own projections: q·k/√d_k, causal.
    q = (np.asarray(x) @ np.asarray(layer.query.kernel[...])).reshape(1, 8, 2, 16)
    k = (np.asarray(x) @ np.asarray(layer.key.kernel[...])).reshape(1, 8, 2, 16)
    raw = np.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
    past = (np.abs(raw) > 0.25) & causal(8)
    np.testing.assert_allclose(stats["softcap_past_knee"], past.sum((0, 2, 3)) / causal(8).sum(),
                               rtol=1e-6)
    assert float(stats["softcap_past_knee"].min()) > 0  # the test's logits do reach the knee
