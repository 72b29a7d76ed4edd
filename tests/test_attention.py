"""attend and SelfAttention: against jax.nn.dot_product_attention, one compilation for all scalar
policies, vmapped scales, the fp16 logits pitfall, and attention dropout."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scale_ablation.model import attention, initializers, policies
from scale_ablation.model.spec import ModelConfig

BATCH, SEQ, HEADS, HEAD_DIM = 2, 7, 3, 16


def normal(seed, shape, dtype=jnp.float32):
    # numpy, not jax.random: every new shape would compile a fresh PRNG program (~1 s on CPU).
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def random_qkv(seed):
    shape = (BATCH, SEQ, HEADS, HEAD_DIM)
    return normal(seed, shape), normal(seed + 1000, shape), normal(seed + 2000, shape)


# --------------------------------------------------------------------------- against jax


@pytest.mark.parametrize("implementation", ["reference", "fused"])
@pytest.mark.parametrize("causal", [True, False])
def test_inv_sqrt_dk_is_jax_default_attention(causal, implementation):
    q, k, v = random_qkv(0)
    ours = attention.attend(
        q, k, v, policy=policies.get("inv_sqrt_dk"), causal=causal, implementation=implementation
    )
    theirs = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", ["reference", "fused"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("c", [0.1, 1.0, 0.9])
def test_const_is_jax_attention_with_that_scale(c, causal, implementation):
    q, k, v = random_qkv(1)
    ours = attention.attend(
        q, k, v, policy=policies.get(f"const:{c}"), causal=causal, implementation=implementation
    )
    theirs = jax.nn.dot_product_attention(q, k, v, scale=c, is_causal=causal)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_causal_mask_puts_last_query_on_last_key():
    mask = np.asarray(attention.causal_mask(3, 5))
    # Query i sees keys 0 .. i + (5 - 3): independent construction.
    expected = np.array([[j <= i + 2 for j in range(5)] for i in range(3)])
    np.testing.assert_array_equal(mask, expected)


def test_unknown_implementation_raises():
    q, k, v = random_qkv(0)
    with pytest.raises(ValueError, match="implementation"):
        attention.attend(q, k, v, policy=policies.get("none"), implementation="flash")


# --------------------------------------------------------------------------- compile once

SCALAR_SPECS = {
    "none": lambda d: 1.0,
    "inv_sqrt_dk": lambda d: 1 / math.sqrt(d),
    "inv_dk": lambda d: 1 / d,
    "inv_log_dk": lambda d: 1 / math.log(d),
    "const:0.1": lambda d: 0.1,
    "gain_aware:2": lambda d: 1 / (4 * math.sqrt(d)),
}


D_MODEL = 48


def build(spec, *, d_model=D_MODEL, heads=HEADS, head_dim=HEAD_DIM, seed=0, **fields):
    """A SelfAttention layer of a checked one-layer ModelConfig (`fields`: other model fields)."""
    model = ModelConfig(d_model=d_model, num_layers=1, num_heads=heads, head_dim=head_dim,
                        layer_policies=(spec,), **fields)
    model.check()
    return attention.SelfAttention(model, policies.get(spec), rngs=nnx.Rngs(seed))


def test_scalar_policies_compile_once():
    x = normal(0, (2, SEQ, D_MODEL))
    traces = []

    def forward(graphdef, state, x):
        traces.append(1)  # runs once per trace, i.e. per compilation
        out, _ = nnx.merge(graphdef, state)(x)
        return out

    forward_jit = jax.jit(forward, static_argnums=0)
    graphdefs, outputs = [], {}
    for spec, formula in SCALAR_SPECS.items():
        module = build(spec)
        graphdef, state = nnx.split(module)
        graphdefs.append(graphdef)
        # The differing number lives in the state, as a ScaleValue.
        assert isinstance(module.base_scale, attention.ScaleValue)
        assert float(module.base_scale[...]) == pytest.approx(formula(HEAD_DIM), rel=1e-6)
        outputs[spec] = forward_jit(graphdef, state, x)
        eager, _ = module(x)
        np.testing.assert_allclose(outputs[spec], eager, rtol=1e-5, atol=1e-6)
    # ScalePolicy leaves base_scale_fn and spec out of equality: one graphdef, one program.
    assert all(g == graphdefs[0] and hash(g) == hash(graphdefs[0]) for g in graphdefs)
    assert len(traces) == 1
    assert forward_jit._cache_size() == 1
    # And the scale really travelled through the state: different policies, different outputs.
    assert not np.allclose(outputs["none"], outputs["inv_sqrt_dk"])


def test_scalar_policies_differ_only_in_base_scale():
    states = [nnx.split(build(spec))[1] for spec in SCALAR_SPECS]
    flat = [dict(nnx.to_flat_state(state)) for state in states]
    for other in flat[1:]:
        assert other.keys() == flat[0].keys()
        for path, variable in other.items():
            same = np.array_equal(variable.get_value(), flat[0][path].get_value())
            assert same == (path != ("base_scale",)), path


def test_vmap_over_base_scale_matches_per_value_calls():
    q, k, v = random_qkv(2)
    scales = jnp.array([0.05, 0.25, 1.0, 3.0])
    batched = jax.vmap(
        lambda s: attention.attend(q, k, v, policy=policies.get("inv_sqrt_dk"), base_scale=s)
    )(scales)
    for i, s in enumerate(scales.tolist()):
        single = attention.attend(q, k, v, policy=policies.get(f"const:{s}"))
        np.testing.assert_allclose(batched[i], single, rtol=1e-5, atol=1e-6)
        reference = jax.nn.dot_product_attention(q, k, v, scale=s, is_causal=True)
        np.testing.assert_allclose(batched[i], reference, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- pitfall 3


def test_fp16_logits_overflow_and_fp32_logits_do_not():
    head_dim = 1024
    # |q|² ≈ 1024 · 100 > 65504, the float16 maximum: the diagonal logits of q·q overflow.
    q = (10.0 * normal(0, (1, 4, 2, head_dim))).astype(jnp.float16)
    v = normal(1, q.shape, jnp.float16)
    policy = policies.get("none")
    out16, internals16 = attention.attend(
        q, q, v, policy=policy, logits_dtype=None, return_internals=True
    )
    assert internals16.logits.dtype == jnp.float16
    assert not bool(jnp.isfinite(internals16.logits).all())
    assert not bool(jnp.isfinite(out16).all())
    out32, internals32 = attention.attend(
        q, q, v, policy=policy, logits_dtype=jnp.float32, return_internals=True
    )
    assert internals32.logits.dtype == jnp.float32
    assert bool(jnp.isfinite(internals32.logits).all())
    assert out32.dtype == jnp.float16 and bool(jnp.isfinite(out32).all())
    # The fp32 path is the float32 computation, rounded to float16 at the end.
    full = attention.attend(
        q.astype(jnp.float32), q.astype(jnp.float32), v.astype(jnp.float32), policy=policy
    )
    np.testing.assert_allclose(out32.astype(jnp.float32), full, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------- dropout


def test_attention_dropout():
    q, k, v = random_qkv(3)
    policy = policies.get("inv_sqrt_dk")

    def run(rate, key, implementation="reference"):
        return attention.attend(
            q,
            k,
            v,
            policy=policy,
            dropout_rate=rate,
            dropout_key=key,
            implementation=implementation,
        )

    plain = run(0.0, None)
    key_a, key_b = jax.random.key(10), jax.random.key(11)
    dropped = run(0.5, key_a)
    assert not np.allclose(dropped, plain)
    np.testing.assert_array_equal(dropped, run(0.5, key_a))
    assert not np.allclose(dropped, run(0.5, key_b))
    np.testing.assert_array_equal(run(0.0, key_a), plain)
    np.testing.assert_array_equal(run(0.5, None), plain)  # no key: evaluation, no dropout
    # The fused kernel has no dropout: asking for both must still drop.
    np.testing.assert_array_equal(run(0.5, key_a, "fused"), dropped)


def test_attention_dropout_against_numpy():
    """Inverted dropout on the softmax weights, written in NumPy (float64): weights × keep /
    (1 − rate) then × v, with the keep mask drawn as the module draws it (one Bernoulli per
    (batch, head, query, key), jax.random.bernoulli with the run's key). Not on the logits,
    not renormalised, not on v."""
    q, k, v = random_qkv(4)
    rate, key = 0.3, jax.random.key(7)
    out = attention.attend(q, k, v, policy=policies.get("inv_sqrt_dk"), dropout_rate=rate,
                           dropout_key=key)
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q64, k64) / math.sqrt(HEAD_DIM)
    visible = np.tril(np.ones((SEQ, SEQ), dtype=bool))
    logits = np.where(visible, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    keep = np.asarray(jax.random.bernoulli(key, 1.0 - rate, weights.shape))
    expected = np.einsum("bhqk,bkhd->bqhd", weights * keep / (1.0 - rate), v64)
    np.testing.assert_allclose(np.asarray(out, dtype=np.float64), expected, rtol=1e-5,
                               atol=1e-5)
    assert 0.2 < 1 - keep.mean() < 0.4  # the mask drops about `rate` of the weights


def test_attention_dropout_is_unbiased():
    """Inverted dropout keeps the expected output: the mean over many keys is the plain output."""
    q, k, v = random_qkv(4)
    policy = policies.get("inv_sqrt_dk")
    draws = 1000
    # rbg keys compile in a fraction of threefry's time; the law does not depend on the PRNG.
    keys = jax.random.split(jax.random.key(0, impl="rbg"), draws)
    outs = jax.jit(
        jax.vmap(
            lambda key: attention.attend(q, k, v, policy=policy, dropout_rate=0.3, dropout_key=key)
        )
    )(keys)
    plain = attention.attend(q, k, v, policy=policy)
    standard_error = np.asarray(outs.std(0)) / math.sqrt(draws)
    assert (standard_error > 0).all()
    assert (np.abs(np.asarray(outs.mean(0)) - np.asarray(plain)) < 5 * standard_error).all()


def test_self_attention_dropout():
    module = build("inv_sqrt_dk", attention_dropout=0.2)
    x = normal(0, (2, SEQ, D_MODEL))
    plain, _ = module(x)
    a, _ = module(x, dropout_key=jax.random.key(1))
    b, _ = module(x, dropout_key=jax.random.key(1))
    assert not np.allclose(a, plain)
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- the module


def test_self_attention_matches_jax_attention_on_its_projections():
    module = build("inv_sqrt_dk")
    x = normal(0, (2, SEQ, D_MODEL))
    out, stats = module(x)
    assert stats is None
    w = {name: np.asarray(getattr(module, name).kernel[...]) for name in ("query", "key", "value")}
    q, k, v = (
        jnp.asarray(np.asarray(x) @ w[n]).reshape(2, SEQ, HEADS, HEAD_DIM)
        for n in ("query", "key", "value")
    )
    expected = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(
        2, SEQ, HEADS * HEAD_DIM
    )
    expected = expected @ module.out.kernel[...]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_self_attention_diagnostics_include_learned_values():
    module = build("learned_per_head")
    _, stats = module(normal(0, (2, SEQ, D_MODEL)), with_diagnostics=True)
    for name in ("logit_std", "max_abs_logit", "entropy", "entropy_normalised", "max_weight"):
        assert stats[name].shape == (HEADS,)
    np.testing.assert_allclose(stats["learned_scale"], 1 / math.sqrt(HEAD_DIM), rtol=1e-6)


@pytest.mark.parametrize("bad", [{"head_dim": 0}, {"heads": 0}, {"head_dim": 7, "positions": "rotary"}])
def test_self_attention_rejects_bad_shapes(bad):
    with pytest.raises(ValueError):
        build("none", **bad)


def test_xavier_normal_std():
    w = initializers.xavier_normal(2.0)(jax.random.key(0), (256, 768))
    assert float(w.std()) == pytest.approx(2.0 * math.sqrt(2 / (256 + 768)), rel=0.02)


@pytest.mark.parametrize("spec", ["inv_sqrt_dk", "log_length", "learned_per_head", "qk_rmsnorm"])
def test_causal_blocks_match_full_attention(spec):
    """Long causal sequences take the block path (masked blocks skipped); it must give the
    full masked computation's output and gradients."""
    seq = 4 * attention.CAUSAL_BLOCK
    q, k, v = jax.random.normal(jax.random.key(7), (3, 2, seq, 2, 8))
    policy = policies.get(spec)
    params = jax.tree.map(lambda p: p * 1.3, policy.init(jax.random.key(1), num_heads=2,
                                                          head_dim=8))

    def blocked(q, k, v, params):
        return attention.attend(q, k, v, policy=policy, params=params).sum()

    def full(q, k, v, params):  # internals force the one-block path
        out, _ = attention.attend(q, k, v, policy=policy, params=params, return_internals=True)
        return out.sum()

    # Each gradient as one program: run eagerly, every operation of the blocks compiles alone.
    grads_blocked = jax.jit(jax.grad(blocked, argnums=(0, 1, 2, 3)))(q, k, v, params)
    grads_full = jax.jit(jax.grad(full, argnums=(0, 1, 2, 3)))(q, k, v, params)
    for a, b in zip(jax.tree.leaves(grads_blocked), jax.tree.leaves(grads_full), strict=True):
        # float32 round-off is relative to the largest terms summed, not to each entry: an
        # entry near 0 (a parameter gradient summed over the batch) moves by ~1e-6 of the max.
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(b).max()))
    if spec == "inv_sqrt_dk":
        np.testing.assert_allclose(
            attention.attend(q, k, v, policy=policy),
            jax.nn.dot_product_attention(q, k, v, is_causal=True), atol=1e-5)


# --------------------------------------------------------------------------- NumPy references


def numpy_attention(q, k, v, scale, causal: bool) -> np.ndarray:
    """softmax(scale · q·k) v in float64; scale: [Tq, H]. Query i of Tq sits at key position
    i + (Tk - Tq) when causal."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    q_len, k_len = q.shape[1], k.shape[1]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * np.asarray(scale, np.float64).T[None, :, :, None]
    if causal:
        visible = np.arange(k_len)[None, :] <= np.arange(q_len)[:, None] + (k_len - q_len)
        logits = np.where(visible, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def numpy_rotary(x, positions, base=10_000.0) -> np.ndarray:
    """Rotate each pair (x[j], x[j + D/2]) by the angle position · base^(-j / (D/2))."""
    x = np.asarray(x, np.float64)
    half = x.shape[-1] // 2
    out = np.empty_like(x)
    for t, position in enumerate(positions):
        for j in range(half):
            angle = position * base ** (-j / half)
            a, b = x[:, t, :, j], x[:, t, :, j + half]
            out[:, t, :, j] = a * math.cos(angle) - b * math.sin(angle)
            out[:, t, :, j + half] = a * math.sin(angle) + b * math.cos(angle)
    return out


@pytest.mark.parametrize("q_len,k_len", [(3, 7), (5, 5), (1, 4)])
def test_keys_per_query_counts_the_visible_keys(q_len, k_len):
    counted = [sum(1 for j in range(k_len) if j <= i + (k_len - q_len)) for i in range(q_len)]
    np.testing.assert_array_equal(attention._keys_per_query(q_len, k_len, True), counted)
    np.testing.assert_array_equal(attention._keys_per_query(q_len, k_len, False), [k_len] * q_len)


def closed_form_scales(q_len: int, k_len: int, head_dim: int) -> dict:
    """(spec, params, [Tq, H] scale) per policy, each scale written from the policy's formula."""
    visible = np.arange(1, q_len + 1) + (k_len - q_len)  # keys seen by each query
    s = np.array([0.7, 1.3, 2.0])[:HEADS]
    log_scale = np.log(np.array([0.2, 0.5, 0.9])[:HEADS])
    inv_sqrt = 1 / math.sqrt(head_dim)
    return {
        "inv_sqrt_dk": ({}, np.full((q_len, HEADS), inv_sqrt)),
        "const:0.3": ({}, np.full((q_len, HEADS), 0.3)),
        "log_length": ({"log_length_s": jnp.asarray(s, jnp.float32)},
                       np.log(visible)[:, None] * s[None, :] * inv_sqrt),
        "learned_per_head": ({"log_scale": jnp.asarray(log_scale, jnp.float32)},
                             np.broadcast_to(np.exp(log_scale), (q_len, HEADS))),
    }


@pytest.mark.parametrize("q_len,k_len", [(3, 7), (SEQ, SEQ)], ids=["q_shorter", "square"])
@pytest.mark.parametrize("spec", ["inv_sqrt_dk", "const:0.3", "log_length", "learned_per_head"])
def test_both_implementations_match_numpy_with_the_closed_form_scale(spec, q_len, k_len):
    params, scale = closed_form_scales(q_len, k_len, HEAD_DIM)[spec]
    q = normal(30, (BATCH, q_len, HEADS, HEAD_DIM))
    k, v = normal(31, (BATCH, k_len, HEADS, HEAD_DIM)), normal(32, (BATCH, k_len, HEADS, HEAD_DIM))
    expected = numpy_attention(q, k, v, scale, causal=True)
    policy = policies.get(spec)
    np.testing.assert_allclose(
        attention.query_scale(policy, params, q_len=q_len, k_len=k_len, num_heads=HEADS,
                              head_dim=HEAD_DIM, causal=True), scale, rtol=1e-6)
    for implementation in ("reference", "fused"):
        out = attention.attend(q, k, v, policy=policy, params=params, causal=True,
                               implementation=implementation)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5, err_msg=implementation)


def test_rotary_matches_numpy():
    x = normal(40, (2, 6, 3, 8))
    positions = np.array([0, 1, 2, 5, 9, 100])
    np.testing.assert_allclose(attention.apply_rotary(x, jnp.asarray(positions)),
                               numpy_rotary(x, positions), rtol=1e-5, atol=1e-5)


def test_rotary_self_attention_rotates_queries_and_keys():
    """The module against NumPy: project, rotate q and k by position, attend at 1/√d_k."""
    module = build("inv_sqrt_dk", positions="rotary")
    x = normal(41, (2, SEQ, D_MODEL))
    out, _ = module(x)
    w = {name: np.asarray(getattr(module, name).kernel[...], np.float64)
         for name in ("query", "key", "value", "out")}
    q, k, v = (np.asarray(x, np.float64) @ w[n] for n in ("query", "key", "value"))
    q, k, v = (a.reshape(2, SEQ, HEADS, HEAD_DIM) for a in (q, k, v))
    positions = np.arange(SEQ)
    q, k = numpy_rotary(q, positions), numpy_rotary(k, positions)
    scale = np.full((SEQ, HEADS), 1 / math.sqrt(HEAD_DIM))
    expected = numpy_attention(q, k, v, scale, causal=True).reshape(2, SEQ, -1) @ w["out"]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- q/k width apart


def test_qk_dim_sets_q_and_k_apart_from_v():
    """model.qk_dim = 12 with head_dim = 4: q, k projections of H·12, v and out of H·4; the
    output is NumPy's attention at d_k = 12 on the module's own projections."""
    module = build("inv_sqrt_dk", head_dim=4, qk_dim=12)
    counts = {name: getattr(module, name).kernel[...].shape for name in ("query", "key",
                                                                          "value", "out")}
    assert counts == {"query": (D_MODEL, HEADS * 12), "key": (D_MODEL, HEADS * 12),
                      "value": (D_MODEL, HEADS * 4), "out": (HEADS * 4, D_MODEL)}
    same = build("inv_sqrt_dk", head_dim=4)
    params = lambda m: sum(p.size for p in jax.tree.leaves(nnx.state(m, nnx.Param)))  # noqa: E731
    assert params(module) - params(same) == 2 * D_MODEL * HEADS * (12 - 4)
    x = normal(50, (2, SEQ, D_MODEL))
    out, _ = module(x)
    w = {name: np.asarray(getattr(module, name).kernel[...], np.float64)
         for name in ("query", "key", "value", "out")}
    q, k = ((np.asarray(x, np.float64) @ w[n]).reshape(2, SEQ, HEADS, 12) for n in ("query", "key"))
    v = (np.asarray(x, np.float64) @ w["value"]).reshape(2, SEQ, HEADS, 4)
    expected = numpy_attention(q, k, v, np.full((SEQ, HEADS), 1 / math.sqrt(12)), causal=True)
    np.testing.assert_allclose(out, expected.reshape(2, SEQ, -1) @ w["out"], rtol=1e-4,
                               atol=1e-5)


def test_qk_dim_zero_is_head_dim_and_leaves_the_model_unchanged():
    a, b = build("inv_sqrt_dk"), build("inv_sqrt_dk", qk_dim=HEAD_DIM)
    assert nnx.split(a)[0] == nnx.split(build("inv_sqrt_dk", qk_dim=0))[0]
    for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)), strict=True):
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------- the precision switches


def test_precision_switches_apart():
    """float16 inputs with |q|² ≈ 1e5: a float16 q·k product overflows (whatever the softmax
    dtype); a float32 product scaled by 1/32 fits float16 and gives the float32 answer."""
    q = (10.0 * normal(0, (1, 4, 2, 1024))).astype(jnp.float16)
    v = normal(1, q.shape, jnp.float16)
    policy = policies.get("inv_sqrt_dk")
    f16_product, internals = attention.attend(q, q, v, policy=policy, qk_product_dtype=None,
                                              softmax_dtype=jnp.float32, return_internals=True)
    assert internals.logits.dtype == jnp.float32
    assert not bool(jnp.isfinite(f16_product).all())
    f16_softmax, internals = attention.attend(q, q, v, policy=policy, qk_product_dtype=jnp.float32,
                                              softmax_dtype=None, return_internals=True)
    assert internals.logits.dtype == jnp.float16 and bool(jnp.isfinite(f16_softmax).all())
    q64, v64 = np.asarray(q, np.float64), np.asarray(v, np.float64)
    expected = numpy_attention(q64, q64, v64, np.full((4, 2), 1 / 32), causal=True)
    np.testing.assert_allclose(f16_softmax.astype(jnp.float32), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, (jnp.float32, jnp.float32)),
    ({"logits_dtype": "activation"}, (None, None)),  # an old config's one switch: both
    ({"logits_dtype": "activation", "softmax_dtype": "float32"}, (None, jnp.float32)),
    ({"qk_product_dtype": "activation"}, (None, jnp.float32)),
])
def test_old_logits_dtype_sets_both_switches_unless_one_is_set(fields, expected):
    model = ModelConfig(d_model=8, num_layers=1, num_heads=1, head_dim=8,
                        layer_policies=("none",), **fields)
    model.check()
    assert tuple(model.attention_precision.values()) == expected
