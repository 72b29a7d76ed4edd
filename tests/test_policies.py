"""Scale policies: a conformance suite over every registered policy, the variance law the
article rests on, spec parsing, and the learned / length-aware / logit-LayerNorm policies checked
against independent numpy references."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scale_ablation.model import attention, diagnostics, initializers, policies
from scale_ablation.model.spec import ModelConfig


# Registered here so that the conformance suite below shows registration is all a new policy
# needs: both are collected from `policies.available()` like the built-in ones.
@policies.register("test_half_sqrt")
def half_sqrt(arg: str | None) -> policies.ScalePolicy:
    return policies.scalar(lambda head_dim: 0.5 / math.sqrt(head_dim))


@policies.register("test_sigmoid_gate")
def sigmoid_gate(arg: str | None) -> policies.ScalePolicy:
    """A learned per-head gate in (0, 2) on 1/√d_k."""

    def init_fn(rng, *, num_heads, head_dim, base_scale):
        return {"gate": jnp.zeros((num_heads,), jnp.float32)}

    def scale(params, ctx):
        return 2.0 * jax.nn.sigmoid(params["gate"]) * ctx.base_scale

    return policies.ScalePolicy(
        base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim),
        scale=scale,
        init_fn=init_fn,
        learned_values=lambda params: {"gate": params["gate"]},
    )


# Policies that need an argument get one; every other policy is used by its bare name, so a new
# policy that needs an argument fails here until it is listed.
DEFAULT_ARGS = {"const": "const:0.1", "gain_aware": "gain_aware:2", "yarn": "yarn:4",
                "c_inv_sqrt_dk": "c_inv_sqrt_dk:3",
                # Small enough that the suite's logits reach them: the cap and the clip act.
                "softcap": "softcap:2", "qk_clip": "qk_clip:1", "temperature": "temperature:2,0.3"}
# Compositions join the suite like any policy (`scale_ablation.model.compose`).
COMPOSED = ["qk_rmsnorm+softcap:2", "inv_dk+sink", "sink+softcap:2", "cosine+sigmoid",
            "learned_per_head+sink+softcap:3"]
SPECS = [DEFAULT_ARGS.get(name, name) for name in policies.available()] + COMPOSED

BATCH, SEQ, HEADS, HEAD_DIM = 2, 6, 2, 8


def normal(seed, shape, dtype=jnp.float32):
    # numpy, not jax.random: every new shape would compile a fresh PRNG program (~1 s on CPU).
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def random_qkv(seed, *, q_len=SEQ, k_len=SEQ, head_dim=HEAD_DIM, dtype=jnp.float32):
    q = normal(seed, (BATCH, q_len, HEADS, head_dim), dtype)
    k = normal(seed + 1000, (BATCH, k_len, HEADS, head_dim), dtype)
    v = normal(seed + 2000, (BATCH, k_len, HEADS, head_dim), dtype)
    return q, k, v


def perturbed_params(policy, seed=1, head_dim=HEAD_DIM):
    """Initial params moved off their starting values, so that per-head/per-dim logic shows."""
    params = policy.init(jax.random.key(seed), num_heads=HEADS, head_dim=head_dim)
    leaves, treedef = jax.tree.flatten(params)
    noisy = [p + 0.3 * normal(seed + i, p.shape) for i, p in enumerate(leaves)]
    return jax.tree.unflatten(treedef, noisy)


def test_registered_test_policies_are_in_the_suite():
    assert "test_half_sqrt" in SPECS and "test_sigmoid_gate" in SPECS
    # Registration works through the public `get` like any built-in policy.
    assert policies.get("test_half_sqrt").base_scale(64) == pytest.approx(0.5 / 8)


# --------------------------------------------------------------------------- conformance


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_shape_dtype_finite(spec, dtype):
    policy = policies.get(spec)
    q, k, v = random_qkv(0, dtype=dtype)
    for causal in (True, False):
        out = attention.attend(
            q, k, v, policy=policy, params=perturbed_params(policy), causal=causal
        )
        assert out.shape == (BATCH, SEQ, HEADS, HEAD_DIM)
        assert out.dtype == dtype
        assert bool(jnp.isfinite(out.astype(jnp.float32)).all())


@pytest.mark.parametrize("spec", SPECS)
def test_jit_matches_eager_with_traced_base_scale(spec):
    policy = policies.get(spec)
    q, k, v = random_qkv(0)
    params = perturbed_params(policy)

    @jax.jit
    def run(q, k, v, params, base_scale):
        return attention.attend(q, k, v, policy=policy, params=params, base_scale=base_scale)

    jitted = run(q, k, v, params, jnp.float32(policy.base_scale(HEAD_DIM)))
    eager = attention.attend(q, k, v, policy=policy, params=params)
    np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", SPECS)
def test_gradients_exist_and_are_finite(spec):
    policy = policies.get(spec)
    q, k, v = random_qkv(0)
    params = perturbed_params(policy)
    cotangent = normal(7, q.shape)

    def loss(q, k, v, params):
        return (attention.attend(q, k, v, policy=policy, params=params) * cotangent).sum()

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, params)
    for name, grad in zip("qkv", grads[:3], strict=True):
        assert bool(jnp.isfinite(grad).all()), name
        assert float(jnp.abs(grad).sum()) > 0, name
    # Every learned parameter gets a finite, nonzero gradient in every entry.
    assert jax.tree.structure(grads[3]) == jax.tree.structure(params)
    for path, grad in jax.tree_util.tree_leaves_with_path(grads[3]):
        assert bool(jnp.isfinite(grad).all()), path
        assert bool((grad != 0).all()), path


@pytest.mark.parametrize("spec", SPECS)
def test_deterministic(spec):
    policy = policies.get(spec)
    q, k, v = random_qkv(0)
    params = perturbed_params(policy)
    first = attention.attend(q, k, v, policy=policy, params=params)
    second = attention.attend(q, k, v, policy=policy, params=params)
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("spec", SPECS)
def test_causal_mask_gives_future_keys_zero_weight(spec):
    policy = policies.get(spec)
    q, k, v = random_qkv(0)
    _, internals = attention.attend(
        q, k, v, policy=policy, params=perturbed_params(policy), return_internals=True
    )
    probs = np.asarray(internals.probs)  # [B, H, Tq, Tk]
    future = np.triu(np.ones((SEQ, SEQ), bool), k=1)  # key j > query i
    assert (probs[..., future] == 0).all()
    assert (probs[..., ~future] > 0).all()
    if policy.weights_sum_to_one:
        np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    else:  # a sink takes a share; sigmoid weights are each in (0, 1), unnormalised
        assert (probs[..., ~future] < 1).all()
    np.testing.assert_array_equal(np.asarray(internals.mask), ~future)


@pytest.mark.parametrize("implementation", ["reference", "fused"])
@pytest.mark.parametrize("spec", SPECS)
def test_causal_output_ignores_future_keys_and_values(spec, implementation):
    policy = policies.get(spec)
    q, k, v = random_qkv(0)
    params = perturbed_params(policy)
    cut = SEQ // 2
    k2 = k.at[:, cut:].set(100.0 * normal(3, k[:, cut:].shape))
    v2 = v.at[:, cut:].set(-50.0)

    def run(k, v):
        return attention.attend(
            q, k, v, policy=policy, params=params, implementation=implementation
        )

    before, after = run(k, v), run(k2, v2)
    np.testing.assert_allclose(after[:, :cut], before[:, :cut], rtol=1e-6, atol=1e-6)
    assert not np.allclose(
        after[:, cut:], before[:, cut:]
    )  # the perturbation does reach later rows


@pytest.mark.parametrize(
    ("causal", "q_len", "k_len"),
    [(True, SEQ, SEQ), (False, SEQ, SEQ),
     pytest.param(True, 3, SEQ, marks=pytest.mark.slow),  # q < k: also in test_attention.py
     pytest.param(False, 3, SEQ, marks=pytest.mark.slow)],
    ids=["causal", "full", "causal_q<k", "full_q<k"],
)
@pytest.mark.parametrize("spec", SPECS)
def test_fused_matches_reference(spec, causal, q_len, k_len):
    """Fusion-capable policies (learned ones with moved params too) fold their multiplier into q;
    the others fall back to the reference path. Both must give the reference's answer. With
    fewer queries than keys the last query sits on the last key (as in a KV cache)."""
    policy = policies.get(spec)
    q, k, v = random_qkv(0, q_len=q_len, k_len=k_len)
    params = perturbed_params(policy)
    outs = {
        impl: attention.attend(
            q, k, v, policy=policy, params=params, causal=causal, implementation=impl
        )
        for impl in ("reference", "fused")
    }
    np.testing.assert_allclose(outs["fused"], outs["reference"], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the variance law


def unit_qk(seed, head_dim, batch=8, seq=64, heads=4):
    shape = (batch, seq, heads, head_dim)
    return normal(seed, shape), normal(seed + 1, shape)


def post_scale_logit_std(policy, q, k, *, base_scale=None):
    _, internals = attention.attend(
        q, k, k, policy=policy, causal=False, base_scale=base_scale, return_internals=True
    )
    stats = diagnostics.attention_stats(internals.logits, internals.probs, internals.mask)
    return np.asarray(stats["logit_std"])  # [heads]


@pytest.mark.parametrize("head_dim", [16, 64, 256, 1024])
def test_variance_law_inv_sqrt_dk_gives_unit_logit_std(head_dim):
    q, k = unit_qk(head_dim, head_dim)
    np.testing.assert_allclose(
        post_scale_logit_std(policies.get("inv_sqrt_dk"), q, k), 1.0, rtol=0.05
    )
    np.testing.assert_allclose(
        post_scale_logit_std(policies.get("none"), q, k), math.sqrt(head_dim), rtol=0.05
    )
    # The same law measured without the diagnostics code: Var(q·k) = d_k.
    raw = np.einsum("bqhd,bkhd->bhqk", np.asarray(q), np.asarray(k))
    assert raw.std() == pytest.approx(math.sqrt(head_dim), rel=0.05)


def gain_projected_qk(seed, gain, *, d_model=256, heads=4, batch=8, seq=64):
    """q, k from unit-variance inputs through Xavier-normal projections with fan_in == fan_out,
    so that gain 1 would give unit-variance q and k."""
    rq, rk = jax.random.split(jax.random.key(seed))
    x = normal(seed, (batch, seq, d_model))
    init = initializers.xavier_normal(gain)
    w_q, w_k = init(rq, (d_model, d_model)), init(rk, (d_model, d_model))
    split = (batch, seq, heads, d_model // heads)
    return (x @ w_q).reshape(split), (x @ w_k).reshape(split)


def test_gain_1_projection_gives_unit_variance_qk():
    q, k = gain_projected_qk(0, 1.0)
    assert float(q.std()) == pytest.approx(1.0, rel=0.05)
    assert float(k.std()) == pytest.approx(1.0, rel=0.05)


def test_gain_aware_compensates_init_gain_squared():
    gain, head_dim = 2.0, 64
    q, k = gain_projected_qk(0, gain)
    assert float(q.std()) == pytest.approx(gain, rel=0.05)
    # Uncompensated, the logit std grows by g² (= 4), not g.
    np.testing.assert_allclose(
        post_scale_logit_std(policies.get("inv_sqrt_dk"), q, k), gain**2, rtol=0.05
    )
    np.testing.assert_allclose(
        post_scale_logit_std(policies.get("gain_aware:2"), q, k), 1.0, rtol=0.05
    )
    # The article's suggested 1/(g·√d_k) leaves the logits twice too wide.
    article = 1.0 / (gain * math.sqrt(head_dim))
    std = post_scale_logit_std(policies.get(f"const:{article}"), q, k)
    np.testing.assert_allclose(std, gain, rtol=0.05)
    assert diagnostics.health_flags({"logit_std": std, "max_weight": np.zeros_like(std)})[
        "logit_std_out_of_band"
    ].all()


def test_self_attention_gain_aware_end_to_end():
    d_model, heads, head_dim = 256, 4, 64
    module = attention.SelfAttention(
        ModelConfig(d_model=d_model, num_layers=1, num_heads=heads, head_dim=head_dim,
                    init_gain=2.0, layer_policies=("gain_aware:2",)),
        policies.get("gain_aware:2"),
        rngs=nnx.Rngs(0),
    )
    norm = nnx.LayerNorm(d_model, use_bias=False, use_scale=False, rngs=nnx.Rngs(0))
    x = norm(normal(1, (4, 128, d_model)))
    assert float(x.std()) == pytest.approx(1.0, rel=0.01)
    _, stats = module(x, with_diagnostics=True)
    logit_std = np.asarray(stats["logit_std"])
    assert float(logit_std.mean()) == pytest.approx(1.0, rel=0.10)
    np.testing.assert_allclose(logit_std, 1.0, rtol=0.15)
    # Control: the same module with the plain 1/√d_k is 4x too wide.
    plain = attention.SelfAttention(
        ModelConfig(d_model=d_model, num_layers=1, num_heads=heads, head_dim=head_dim,
                    init_gain=2.0, layer_policies=("inv_sqrt_dk",)),
        policies.get("inv_sqrt_dk"),
        rngs=nnx.Rngs(0),
    )
    _, plain_stats = plain(x, with_diagnostics=True)
    assert float(plain_stats["logit_std"].mean()) == pytest.approx(4.0, rel=0.10)


# --------------------------------------------------------------------------- spec parsing


@pytest.mark.parametrize("spec", ["const:abc", "const:-1", "const", "const:0", "const:nan"])
def test_bad_const_specs_name_the_policy(spec):
    with pytest.raises(ValueError, match="'const'"):
        policies.get(spec)


def test_unknown_policy_lists_available_names():
    with pytest.raises(ValueError) as info:
        policies.get("nosuch")
    message = str(info.value)
    assert "nosuch" in message
    for name in policies.available():
        assert name in message


def test_near_miss_suggests_the_close_name():
    with pytest.raises(ValueError, match=r"(?i)did you mean 'inv_sqrt_dk'"):
        policies.get("inv_sqrt")


@pytest.mark.parametrize("spec", ["none:3", "inv_sqrt_dk:2", "logit_layernorm:1"])
def test_argument_to_argless_policy_raises(spec):
    with pytest.raises(ValueError, match=re.escape(repr(spec.partition(":")[0]))):
        policies.get(spec)


@pytest.mark.parametrize("name", ["", "a:b"])
def test_register_rejects_bad_names(name):
    with pytest.raises(ValueError):
        policies.register(name)


def test_scalar_policies_give_their_formula():
    for spec, expected in [
        ("none", lambda d: 1.0),
        ("inv_sqrt_dk", lambda d: 1 / math.sqrt(d)),
        ("inv_dk", lambda d: 1 / d),
        ("inv_dk:8", lambda d: 8 / d),
        ("inv_log_dk", lambda d: 1 / math.log(d)),
        ("const:0.1", lambda d: 0.1),
        ("gain_aware:2", lambda d: 1 / (4 * math.sqrt(d))),
    ]:
        for head_dim in (16, 64, 1024):
            assert policies.get(spec).base_scale(head_dim) == pytest.approx(expected(head_dim))
    assert policies.get("const:0.1").spec == "const:0.1"


# --------------------------------------------------------------------------- learned policies


def effective_scale(policy, params, *, q_len=4, k_len=4, head_dim=HEAD_DIM, causal=True):
    """The multiplier the attention applies, [Tq, H]."""
    return attention.query_scale(
        policy, params, q_len=q_len, k_len=k_len, num_heads=HEADS, head_dim=head_dim, causal=causal
    )


@pytest.mark.parametrize("name", ["learned", "learned_per_head"])
@pytest.mark.parametrize("head_dim", [16, 64, 256])
def test_learned_initialises_at_inv_sqrt_dk(name, head_dim):
    policy = policies.get(name)
    params = policy.init(jax.random.key(0), num_heads=HEADS, head_dim=head_dim)
    np.testing.assert_allclose(
        effective_scale(policy, params, head_dim=head_dim), 1 / math.sqrt(head_dim), rtol=1e-6
    )
    # End to end: at initialisation the policy is jax's default attention.
    q, k, v = random_qkv(0, head_dim=head_dim)
    np.testing.assert_allclose(
        attention.attend(q, k, v, policy=policy, params=params),
        jax.nn.dot_product_attention(q, k, v, is_causal=True),
        rtol=1e-5,
        atol=1e-5,
    )


def test_learned_with_argument_initialises_at_it():
    for name in ("learned", "learned_per_head"):
        policy = policies.get(f"{name}:0.5")
        params = policy.init(jax.random.key(0), num_heads=HEADS, head_dim=64)
        np.testing.assert_allclose(effective_scale(policy, params, head_dim=64), 0.5, rtol=1e-6)


def test_learned_per_head_has_one_scale_per_head():
    heads = 5
    policy = policies.get("learned_per_head")
    params = policy.init(jax.random.key(0), num_heads=heads, head_dim=16)
    assert policy.learned_values(params)["scale"].shape == (heads,)
    shared = policies.get("learned")
    shared_params = shared.init(jax.random.key(0), num_heads=heads, head_dim=16)
    assert shared.learned_values(shared_params)["scale"].size == 1


@pytest.mark.parametrize("name", ["learned", "learned_per_head"])
def test_learned_scale_stays_positive_after_big_step(name):
    policy = policies.get(name)
    params = policy.init(jax.random.key(0), num_heads=HEADS, head_dim=HEAD_DIM)
    start = effective_scale(policy, params)
    grads = jax.grad(lambda params: effective_scale(policy, params).mean())(params)
    # Plainly parametrised, a scale of ~0.35 with gradient 1 (or 1/heads) would go to about -50
    # (or -25) under this step.
    stepped = jax.tree.map(lambda p, g: p - 50.0 * g, params, grads)
    after = effective_scale(policy, stepped)
    assert bool((after > 0).all()) and bool(jnp.isfinite(after).all())
    assert bool((after < 1e-3 * start).all())  # the step was big, and went the right way


def test_log_length_scale_is_s_ln_n_over_sqrt_dk():
    head_dim, seq = 16, 9
    policy = policies.get("log_length")
    s = np.array([0.7, 1.9], np.float32)  # per head, away from the initial 1
    params = {"log_length_s": jnp.asarray(s)}
    q = normal(0, (1, seq, HEADS, head_dim))
    k = normal(1, (1, seq, HEADS, head_dim))
    _, internals = attention.attend(q, k, k, policy=policy, params=params, return_internals=True)
    raw = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64), np.asarray(k, np.float64))
    positions = np.arange(seq)
    expected_scale = s[:, None] * np.log(positions + 1)[None, :] / math.sqrt(head_dim)  # [H, Tq]
    expected = raw * expected_scale[None, :, :, None]
    np.testing.assert_allclose(internals.logits, expected, rtol=1e-4, atol=1e-5)
    # Without the mask every query sees all `seq` keys.
    np.testing.assert_allclose(
        effective_scale(policy, params, q_len=seq, k_len=seq, head_dim=head_dim, causal=False),
        (s[None, :] * math.log(seq) / math.sqrt(head_dim)).repeat(seq, 0),
        rtol=1e-6,
    )


@pytest.mark.parametrize("causal", [True, False])
def test_logit_layernorm_normalises_over_visible_keys(causal):
    head_dim, seq = 16, 7
    q = 3.0 * normal(0, (BATCH, seq, HEADS, head_dim))
    k = normal(1, (BATCH, seq, HEADS, head_dim))
    _, internals = attention.attend(
        q, k, k, policy=policies.get("logit_layernorm"), causal=causal, return_internals=True
    )
    logits = np.asarray(internals.logits)
    raw = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64), np.asarray(k, np.float64))
    for b in range(BATCH):
        for h in range(HEADS):
            for i in range(seq):
                visible = raw[b, h, i, : i + 1] if causal else raw[b, h, i]
                centred = visible - visible.mean()
                normed = centred / visible.std() if visible.size > 1 else centred
                np.testing.assert_allclose(
                    logits[b, h, i, : visible.size],
                    normed / math.sqrt(head_dim),
                    rtol=1e-4,
                    atol=1e-5,
                    err_msg=f"b={b} h={h} i={i}",
                )


@pytest.mark.parametrize("name", [n for n in policies.available() if not n.startswith("test_")])
def test_same_spec_gives_equal_policy(name):
    """Two models built from one spec must share compiled programs: their policies compare
    (and hash) equal, learned ones included."""
    spec = DEFAULT_ARGS.get(name, name)
    first, second = policies.get(spec), policies.get(spec)
    assert first == second and hash(first) == hash(second)
