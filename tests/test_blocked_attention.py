"""The blocked causal attention (`model.blocked_attention`) against the dense masked softmax.

References: a float64 NumPy attention for the forward, and `jax.grad` through the dense path's
whole [T, T] softmax (`attend(..., return_internals=True)`, an independent implementation that
autodiff differentiates) for the gradients of q, k, v and every learned policy parameter.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scale_ablation.model import attention, blocked_attention, policies
from scale_ablation.model.build import build_model
from scale_ablation.model.spec import ModelConfig

# Policies that need an argument get one (a positive number every built-in one accepts).
POLICY_ARG = "2"
HEADS, HEAD_DIM = 2, 8


def normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def qkv(seed, seq, batch=2):
    shape = (batch, seq, HEADS, HEAD_DIM)
    return normal(seed, shape), normal(seed + 1, shape), normal(seed + 2, shape)


def numpy_causal(q, k, v, scale):
    """softmax(scale · q·k) v in float64 with query i seeing keys 0..i; scale: [T, H]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * np.asarray(scale, np.float64).T[None, :, :, None]
    seq = q.shape[1]
    logits = np.where(np.tril(np.ones((seq, seq), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def assert_float32_close(actual, expected, rtol=2e-5):
    # Round-off is relative to the largest terms summed: an entry near 0 moves by ~1e-6 of the max.
    expected = np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol,
                               atol=rtol / 10 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("seq,block", [(1, 16), (16, 16), (45, 16), (64, 16), (100, 32), (9, 64)])
def test_forward_and_gradients_equal_dense_at_lengths_and_blocks(seq, block):
    """Lengths that fill the blocks, that leave the last block short, and shorter than a block."""
    q, k, v = qkv(seq, seq)
    scale = jnp.asarray(np.random.default_rng(0).uniform(0.1, 0.6, (seq, HEADS)), jnp.float32)
    out = blocked_attention.blocked_attention(q, k, v, scale, block_size=block)
    np.testing.assert_allclose(out, numpy_causal(q, k, v, scale), rtol=1e-5, atol=1e-5)

    def dense(q, k, v, scale):
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale.T[None, :, :, None]
        logits = jnp.where(attention.causal_mask(seq, seq), logits, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)

    # A weighted sum, so that every output entry's cotangent differs.
    weights = normal(99, out.shape)
    grads = [jax.jit(jax.grad(lambda *a, f=f: (f(*a) * weights).sum(), argnums=(0, 1, 2, 3)))(
        q, k, v, scale) for f in (lambda *a: blocked_attention.blocked_attention(*a, block_size=block), dense)]
    for blocked, reference in zip(*grads, strict=True):
        assert_float32_close(blocked, reference)


def registered_specs() -> list[str]:
    """Every registered policy, with `POLICY_ARG` where it needs an argument."""
    specs = []
    for name in policies.available():
        try:
            policies.get(name)
            specs.append(name)
        except ValueError as error:
            if "needs an argument" not in str(error):
                raise
            specs.append(f"{name}:{POLICY_ARG}")
    return specs


@pytest.mark.parametrize("spec", registered_specs())
def test_every_policy_matches_the_dense_path(spec):
    """Through `attend`: a policy the blocked path can take gives the dense path's output and
    gradients (q, k, v and its own learned parameters); one it cannot keeps the dense path."""
    policy = policies.get(spec)
    seq = blocked_attention.SMALL_BLOCK + 37  # two blocks, the second short
    q, k, v = qkv(3, seq, batch=1)
    params = jax.tree.map(lambda p: p * 1.3, policy.init(jax.random.key(1), num_heads=HEADS,
                                                          head_dim=HEAD_DIM))
    weights = normal(98, q.shape)

    def loss(implementation):
        def run(q, k, v, params):
            out = attention.attend(q, k, v, policy=policy, params=params,
                                   implementation=implementation, return_internals=False)
            return (out * weights).sum()
        return run

    def dense_loss(q, k, v, params):  # internals force the whole [T, T] softmax
        out, _ = attention.attend(q, k, v, policy=policy, params=params, return_internals=True)
        return (out * weights).sum()

    # Jitted: eager dispatch of every small op costs more than compiling here.
    blocked = jax.jit(jax.value_and_grad(loss("blocked"), argnums=(0, 1, 2, 3)))(q, k, v, params)
    dense = jax.jit(jax.value_and_grad(dense_loss, argnums=(0, 1, 2, 3)))(q, k, v, params)
    (value, grads), (dense_value, dense_grads) = blocked, dense
    assert_float32_close(value, dense_value)
    for a, b in zip(grads[:3], dense_grads[:3], strict=True):
        assert_float32_close(a, b)
    # A parameter's gradient sums B·T·H terms that cancel: the dense path's own float32 error on
    # log_length's s was 2e-5 relative (measured against float64), so allow 1e-4 here.
    for a, b in zip(jax.tree.leaves(grads[3]), jax.tree.leaves(dense_grads[3]), strict=True):
        assert_float32_close(a, b, rtol=1e-4)
    takes_blocked = "custom_vjp" in str(jax.make_jaxpr(loss("blocked"))(q, k, v, params))
    assert takes_blocked == (policy.fused_unsupported() is None)


def test_backward_keeps_output_and_log_sum_exp_not_weights():
    seq, block = 96, 16
    q, k, v = qkv(5, seq)
    scale = jnp.full((seq, HEADS), 0.3)
    _, vjp = jax.vjp(lambda q, k, v: blocked_attention.blocked_attention(
        q, k, v, scale, block_size=block), q, k, v)
    sizes = [x.size for x in jax.tree.leaves(vjp)]
    batch_heads = 2 * HEADS
    # Inputs and output are B·H·T·D each; the log-sum-exp B·H·T. Weights would be B·H·T².
    assert max(sizes) <= batch_heads * seq * HEAD_DIM
    # q (scaled), k, v, the output, the log-sum-exp, the scale, and a few scalar constants.
    assert sum(sizes) <= 4 * batch_heads * seq * HEAD_DIM + batch_heads * seq + seq * HEADS + 8
    # The dense path does store [T, T] weights: the bound above can fail.
    _, dense_vjp = jax.vjp(lambda q, k, v: attention.attend(
        q, k, v, policy=policies.get("const:0.3"), return_internals=True)[0], q, k, v)
    assert max(x.size for x in jax.tree.leaves(dense_vjp)) >= batch_heads * seq * seq


@pytest.mark.parametrize("shapes", [
    ((2, 16, HEADS, HEAD_DIM), (2, 16, HEADS, 4), (2, 16, HEADS, HEAD_DIM), (16, HEADS)),  # k
    ((2, 16, HEADS, HEAD_DIM), (2, 16, HEADS, HEAD_DIM), (2, 8, HEADS, HEAD_DIM), (16, HEADS)),
    ((2, 16, HEADS, HEAD_DIM), (2, 16, HEADS, HEAD_DIM), (2, 16, HEADS, HEAD_DIM), (16, 1)),
])
def test_mismatched_shapes_are_refused_naming_all_four(shapes):
    q, k, v, scale = (jnp.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match="blocked attention needs") as raised:
        blocked_attention.blocked_attention(q, k, v, scale)
    assert all(str(s) in str(raised.value) for s in shapes)


def test_dropout_internals_and_cross_attention_keep_the_dense_path():
    policy = policies.get("inv_sqrt_dk")
    q, k, v = qkv(7, 40)
    key = jax.random.key(3)
    for kwargs in ({"dropout_rate": 0.3, "dropout_key": key}, {"causal": False}):
        blocked = attention.attend(q, k, v, policy=policy, implementation="blocked", **kwargs)
        dense = attention.attend(q, k, v, policy=policy, implementation="reference", **kwargs)
        np.testing.assert_array_equal(blocked, dense)
    short_q = q[:, :30]  # 30 queries on the last 30 of 40 keys
    np.testing.assert_array_equal(
        attention.attend(short_q, k, v, policy=policy, implementation="blocked"),
        attention.attend(short_q, k, v, policy=policy, implementation="reference"))
    _, internals = attention.attend(q, k, v, policy=policy, implementation="blocked",
                                    return_internals=True)
    assert internals.probs.shape == (2, HEADS, 40, 40)


def test_bfloat16_activations_match_the_dense_path_to_bfloat16_rounding():
    policy = policies.get("inv_sqrt_dk")
    q, k, v = (x.astype(jnp.bfloat16) for x in qkv(11, 50))
    blocked = attention.attend(q, k, v, policy=policy, implementation="blocked")
    assert blocked.dtype == jnp.bfloat16
    reference = numpy_causal(q, k, v, jnp.full((50, HEADS), HEAD_DIM**-0.5))
    np.testing.assert_allclose(np.asarray(blocked, np.float32), reference, atol=2e-2)
    # Activation-dtype logits (the article's pitfall 3) stay on the dense path, bit for bit.
    np.testing.assert_array_equal(
        attention.attend(q, k, v, policy=policy, implementation="blocked", logits_dtype=None),
        attention.attend(q, k, v, policy=policy, implementation="reference", logits_dtype=None))


def test_auto_takes_the_blocked_path_from_the_measured_length_on():
    policy = policies.get("none")
    for seq in (blocked_attention.AUTO_MIN_SEQ - 1, blocked_attention.AUTO_MIN_SEQ):
        q, k, v = qkv(13, seq, batch=1)
        jaxpr = str(jax.make_jaxpr(lambda q, k, v: attention.attend(
            q, k, v, policy=policy, implementation="auto"))(q, k, v))
        assert ("custom_vjp" in jaxpr) == (seq >= blocked_attention.AUTO_MIN_SEQ)


@pytest.mark.parametrize("impl", ["blocked", "auto"])
def test_model_config_accepts_blocked_and_the_lm_matches_reference(impl):
    seq = blocked_attention.AUTO_MIN_SEQ + 13  # where "auto" takes the blocked path too

    def model(attention_impl):
        spec = ModelConfig(d_model=32, num_layers=2, num_heads=2, head_dim=16, max_seq_len=seq,
                           layer_policies=("learned_per_head", "inv_sqrt_dk"),
                           attention_impl=attention_impl)
        spec.check()
        return build_model(spec, nnx.Rngs(params=0))

    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, seq)), jnp.int32)
    def logits(attention_impl):
        graphdef, state = nnx.split(model(attention_impl))
        return jax.jit(lambda state: nnx.merge(graphdef, state)(tokens)[0])(state)

    logits = {name: logits(name) for name in (impl, "reference")}
    assert_float32_close(logits[impl], logits["reference"])
    with pytest.raises(Exception, match="attention_impl"):
        ModelConfig(d_model=32, num_layers=1, num_heads=2, head_dim=16,
                    layer_policies=("none",), attention_impl="flash").check()
