
"""The language model: shapes, causality, per-layer policies, precision, init gain, bad fields.

References are independent of `model.py`: a NumPy attention with the scale each policy should
give, the Xavier variance formula, and the float32 model for the bfloat16 one.
"""

import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scale_ablation.model.build import build_model
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import run_config

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 256


def tiny_config(**overrides):
    """The quick config shrunk to a model that compiles in about a second."""
    config = experiment.load_config(str(REPO / "experiments" / "base.py") + ":quick")
    small = {
        "model.d_model": 32,
        "model.num_layers": 2,
        "model.num_heads": 2,
        "model.head_dim": 16,
        "model.max_seq_len": 64,
        "data.seq_len": 32,
    }
    return experiment.apply_overrides(config, {**small, **overrides})


def model_of(config, seed):
    return build_model(run_config.model_config(config), nnx.Rngs(params=seed))


def make_forward(model):
    """tokens -> logits, jitted once per model (the functional split/merge style)."""
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens)[0])
    return lambda tokens: run(state, tokens)


def random_tokens(seed, shape=(2, 32)):
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, size=shape), jnp.int32)


def test_logits_shape_and_dtype():
    model = model_of(tiny_config(), seed=0)
    logits = make_forward(model)(random_tokens(0, (3, 24)))
    assert logits.shape == (3, 24, VOCAB)
    assert logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize(
    "positions,norm_position,attention_impl",
    [
        ("learned", "pre", "reference"),
        ("learned", "post", "reference"),
        ("rotary", "pre", "reference"),
        ("rotary", "post", "reference"),
        ("learned", "pre", "fused"),
    ],
)
def test_lm_is_causal(positions, norm_position, attention_impl):
    config = tiny_config(
        **{
            "model.positions": positions,
            "model.norm_position": norm_position,
            "model.attention_impl": attention_impl,
        }
    )
    forward = make_forward(model_of(config, seed=1))
    tokens = random_tokens(1)
    t = 11
    future_changed = tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 17) % VOCAB)
    base, changed = forward(tokens), forward(future_changed)
    # Positions <= t see only tokens <= t: the logits there must not move.
    np.testing.assert_allclose(changed[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-6)
    assert np.abs(np.asarray(changed[:, t + 1 :] - base[:, t + 1 :])).max() > 1e-3

    # And the check is not vacuous: the model does look back (token 0 moves later logits).
    past_changed = tokens.at[:, 0].set((tokens[:, 0] + 17) % VOCAB)
    moved = np.abs(np.asarray(forward(past_changed)[:, 1:] - base[:, 1:])).max(axis=-1)
    assert (moved > 1e-4).mean() > 0.9


def reference_attention(x, wq, wk, wv, wo, num_heads, head_dim, scale):
    """softmax(scale·q·kᵀ + causal mask)·v in NumPy float64, projections without bias."""
    batch, seq, _ = x.shape

    def heads(w):
        return (x @ w).reshape(batch, seq, num_heads, head_dim)  # (B, T, H, D)

    q, k, v = heads(wq), heads(wk), heads(wv)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    logits = np.where(np.tril(np.ones((seq, seq), bool)), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, num_heads * head_dim)
    return out @ wo


def test_layer_policies_give_each_layer_its_own_scale():
    head_dim, num_heads = 16, 2
    config = tiny_config(layer_policies="none,inv_sqrt_dk")
    model = model_of(config, seed=2)
    first, second = (block.attention for block in model.blocks)
    assert (first.policy.spec, second.policy.spec) == ("none", "inv_sqrt_dk")
    assert float(first.base_scale[...]) == pytest.approx(1.0)
    assert float(second.base_scale[...]) == pytest.approx(1 / math.sqrt(head_dim))

    # Each layer computes attention with its own scale: 1 and 1/√d_k.
    x = np.random.default_rng(2).normal(size=(2, 16, config.model.d_model))
    for attention, scale, other in ((first, 1.0, 0.25), (second, 0.25, 1.0)):
        weights = [
            np.asarray(layer.kernel[...], np.float64)
            for layer in (attention.query, attention.key, attention.value, attention.out)
        ]
        out, _ = attention(jnp.asarray(x, jnp.float32))
        expected = reference_attention(x, *weights, num_heads, head_dim, scale)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=2e-4, atol=2e-5)
        wrong = reference_attention(x, *weights, num_heads, head_dim, other)
        assert np.abs(np.asarray(out) - wrong).max() > 1e-2


def test_bfloat16_compute_keeps_float32_params_and_logits():
    tokens = random_tokens(3)
    model32 = model_of(tiny_config(), seed=3)
    model16 = model_of(tiny_config(**{"train.dtype": "bfloat16"}), seed=3)
    params32 = jax.tree.leaves(nnx.state(model32, nnx.Param))
    params16 = jax.tree.leaves(nnx.state(model16, nnx.Param))
    assert params16 and all(p.dtype == jnp.float32 for p in params16)
    for a, b in zip(params32, params16, strict=True):
        np.testing.assert_array_equal(a, b)  # same init; only the compute dtype differs

    logits32, logits16 = make_forward(model32)(tokens), make_forward(model16)(tokens)
    assert logits16.dtype == jnp.float32
    error = np.abs(np.asarray(logits16 - logits32))
    # bfloat16 keeps 8 mantissa bits: the logits move, by about 1% of their size, no more.
    scale = np.abs(np.asarray(logits32)).max()
    assert 1e-4 * scale < error.max() < 0.05 * scale


def test_float16_mlp_gradient_stays_finite_past_gelus_overflow_point():
    """The tanh-GELU's derivative takes 3z², past float16's 65504 for |z| >= 148: computed in
    float16 its gradient is NaN there. The float16 block's MLP gradient must be finite and agree
    with the float32 block's, from the same weights, to float16's precision."""
    blocks = [model_of(tiny_config(**({"train.dtype": "float16"} if half else {})), seed=4)
              .blocks[0] for half in (True, False)]
    for block in blocks:  # pre-activations of a few hundred, as a float16 run at a large LR has
        block.mlp_in.kernel[...] = block.mlp_in.kernel[...] * 400
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 32)), jnp.float32)
    pre = np.abs(np.asarray(blocks[0].mlp_in(x.astype(jnp.float16)), np.float32))
    assert pre.max() > 148  # the premise: some inputs are past the overflow point

    def input_grad(block, dtype):
        loss = lambda x: 1e-3 * block.mlp(x).astype(jnp.float32).sum()  # noqa: E731
        return np.asarray(jax.grad(loss)(x.astype(dtype)), np.float32)

    half, full = input_grad(blocks[0], jnp.float16), input_grad(blocks[1], jnp.float32)
    assert np.isfinite(half).all()
    np.testing.assert_allclose(half, full, rtol=0.02, atol=0.02 * np.abs(full).max())


@pytest.mark.parametrize("init", ["fan_in", "xavier"])
def test_init_gain_scales_query_and_key_outputs(init):
    # num_heads·head_dim = 32 != d_model = 128: the two inits' variances differ by 1.6x.
    d_model, num_heads, head_dim = 128, 4, 8
    sizes = {"model.d_model": d_model, "model.num_heads": num_heads, "model.head_dim": head_dim,
             "model.init": init}
    x = jnp.asarray(np.random.default_rng(4).normal(size=(4096, d_model)), jnp.float32)

    def projection_stds(gain):
        model = model_of(tiny_config(**sizes, **{"model.init_gain": gain}), seed=4)
        attention = model.blocks[0].attention
        return [
            float(jnp.std(layer(x))) for layer in (attention.query, attention.key, attention.value)
        ]

    (q1, k1, v1), (q2, k2, v2) = projection_stds(1.0), projection_stds(2.0)
    # Unit-variance inputs: Var(x·w) = fan_in · Var(w), with Var(w) = gain² / fan_in (fan_in)
    # or gain² · 2 / (fan_in + fan_out) (Xavier).
    inner = num_heads * head_dim
    expected_std = 1.0 if init == "fan_in" else math.sqrt(d_model * 2 / (d_model + inner))
    for std in (q1, k1, v1):
        assert std == pytest.approx(expected_std, rel=0.08)
    assert q2 / q1 == pytest.approx(2.0, rel=0.1)
    assert k2 / k1 == pytest.approx(2.0, rel=0.1)
    assert v2 / v1 == pytest.approx(1.0, rel=0.1)  # the gain is for q and k only


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"model.head_dim": 0}, "model.head_dim"),
        ({"model.head_dim": -8}, "model.head_dim"),
        ({"model.norm": "batchnorm"}, "model.norm"),
        ({"model.logits_dtype": "float16"}, "model.logits_dtype"),
    ],
)
def test_build_model_rejects_bad_fields(overrides, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        model_of(tiny_config(**overrides), seed=0)
