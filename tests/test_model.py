
"""The language model: shapes, causality, per-layer policies, precision, init gain, bad fields.

References are independent of `model.py`: a NumPy attention with the scale each policy should
give, the Xavier variance formula, and the float32 model for the bfloat16 one.
"""

import dataclasses
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


# --- model.norm=rmsnorm, the coordinates, ModelConfig's other refusals -----------------------

def small_model(**fields):
    from scale_ablation.model.lm import LanguageModel
    from scale_ablation.model.spec import ModelConfig

    config = ModelConfig(d_model=32, num_layers=2, num_heads=2, head_dim=16, max_seq_len=16,
                         layer_policies=("inv_sqrt_dk",) * 2, **fields)
    config.check()
    return LanguageModel(config, rngs=nnx.Rngs(params=0))


def test_rmsnorm_model_normalises_by_the_root_mean_square():
    model = small_model(norm="rmsnorm")
    norm = model.blocks[0].attention_norm
    x = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32) * 3 + 1
    gain = np.asarray(norm.scale[...])
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * gain
    np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), expected, rtol=1e-5, atol=1e-5)
    assert not hasattr(norm, "bias")  # no centring: an RMSNorm, not a LayerNorm
    logits, _ = model(jnp.zeros((1, 8), jnp.int32))
    assert np.isfinite(np.asarray(logits)).all()


def test_coordinates_are_the_mean_abs_of_each_activation_family():
    model = small_model()
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, VOCAB, (2, 12)), jnp.int32)
    coords = {name: float(v) for name, v in model.coordinates(tokens).items()}
    # By hand from the modules, the stream written out as the pre-norm blocks define it.
    mean_abs = lambda a: float(np.abs(np.asarray(a, np.float64)).mean())  # noqa: E731
    x = model.embed(tokens)
    embedding = mean_abs(x)
    x = x + model.position_embed(jnp.arange(12))[None]
    attn, mlp, logit_sizes = [], [], []
    visible = np.tril(np.ones((12, 12), bool))
    for block in model.blocks:
        h = np.asarray(block.attention_norm(x), np.float64)
        q, k = (h @ np.asarray(p.kernel[...], np.float64) for p in (block.attention.query,
                                                                     block.attention.key))
        q, k = q.reshape(2, 12, 2, 16), k.reshape(2, 12, 2, 16)
        logits = np.einsum("bqhd,bkhd->bhqk", q, k) / 4.0  # 1/√16
        logit_sizes.append(np.abs(logits)[:, :, visible].mean())
        a, _ = block.attention(block.attention_norm(x))
        x = x + a
        m = block.mlp(block.mlp_norm(x))
        x = x + m
        attn.append(mean_abs(a)), mlp.append(mean_abs(m))
    expected = {"embedding": embedding, "attn_logits": float(np.mean(logit_sizes)),
                "attn_output": float(np.mean(attn)), "mlp_output": float(np.mean(mlp)),
                "residual": mean_abs(x), "output_logits": mean_abs(model(tokens)[0])}
    assert coords == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("fields, says", [
    ({"qk_dim": -8}, r"^model\.qk_dim must be 0 \(= model\.head_dim\) or a positive width, "
                     r"got -8$"),
    ({"qk_dim": 8.5}, r"^model\.qk_dim must be .* got 8\.5$"),
    ({"head_dim": 1, "layer_policies": ("inv_log_dk",)},  # 1/ln(1)
     r"^policy 'inv_log_dk' has no scale at d_k=1: "),
    ({"num_layers": 2}, r"^1 layer policies for model\.num_layers=2$"),  # one spec, two layers
])
def test_model_config_refusals_past_the_schema(fields, says):
    from scale_ablation.errors import ConfigError
    from scale_ablation.model.spec import ModelConfig

    base = {"d_model": 32, "num_layers": 1, "num_heads": 2, "head_dim": 16,
            "layer_policies": ("inv_sqrt_dk",)}
    with pytest.raises(ConfigError, match=says):
        ModelConfig(**{**base, **fields}).check()


def test_a_policy_whose_scale_is_not_finite_is_refused(monkeypatch):
    # A user's policy may compute inf where a built-in one raises: the check names it.
    from scale_ablation.errors import ConfigError
    from scale_ablation.model import policies
    from scale_ablation.model.spec import ModelConfig

    monkeypatch.setitem(policies._REGISTRY, "test_infinite_scale",
                        lambda arg: policies.scalar(lambda head_dim: float("inf")))
    model = ModelConfig(d_model=32, num_layers=1, num_heads=2, head_dim=16,
                        layer_policies=("test_infinite_scale",))
    with pytest.raises(ConfigError, match=r"^policy 'test_infinite_scale' gives scale inf at "
                                          r"d_k=16$"):
        model.check()


def test_residual_dtype_float32_keeps_the_stream_apart_from_the_compute_dtype():
    from scale_ablation.model.spec import ModelConfig

    model = ModelConfig(d_model=32, num_layers=1, num_heads=2, head_dim=16, dtype="bfloat16",
                        residual_dtype="float32", layer_policies=("inv_sqrt_dk",))
    assert (model.stream_dtype, model.compute_dtype) == (jnp.float32, jnp.bfloat16)
    assert dataclasses.replace(model, residual_dtype="").stream_dtype == jnp.bfloat16
