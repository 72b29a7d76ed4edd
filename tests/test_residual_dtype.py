"""`model.residual_dtype = "float32"`: a float32 residual stream under float16 compute.

What is checked, against references the model code does not share: the dtypes the program
actually computes in (the stream, the norms and the additions float32; every matmul float16)
read off `jax.eval_shape` and the traced program; one block against a block written out here
in jnp (float32 norms and additions, float16 matmuls); and the whole model against the float32
model with the same parameters, where a stream away from zero (entries near 16, where float16's
spacing is 2^-6) tells a float32 stream from a float16 one. (Not much further: flax's LayerNorm
takes the variance as E[x²] - E[x]², which in float32 loses the variance of a stream near 300.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_model import make_forward, model_of, random_tokens, tiny_config
from test_train_faults import main_args, one_error_line, run_module

from scale_ablation.errors import ConfigError
from scale_ablation.training.run_config import validate

F16, F32 = jnp.float16, jnp.float32
MIXED = {"train.dtype": "float16", "model.residual_dtype": "float32"}
OFFSET = 16.0  # float16's spacing in [16, 32) is 2^-6: a float16 stream rounds to it


def sub_jaxprs(value):
    """The jaxprs inside an equation's parameter (a jit's, a custom_jvp's, a scan's body)."""
    if hasattr(value, "jaxpr") and hasattr(value, "consts"):  # ClosedJaxpr
        yield value.jaxpr
    elif hasattr(value, "eqns"):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from sub_jaxprs(item)


def equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in sub_jaxprs(value):
                yield from equations(inner)


def test_the_stream_norms_and_additions_are_float32_and_every_matmul_float16():
    config = tiny_config(**MIXED)
    model = model_of(config, seed=0)
    tokens = random_tokens(0, (2, 16))
    x = jax.ShapeDtypeStruct((2, 16, config.model.d_model), F32)
    assert jax.eval_shape(model.embed, tokens).dtype == F32
    for block in model.blocks:
        assert jax.eval_shape(lambda h, b=block: b(h)[0], x).dtype == F32  # stream in, out
        for norm in (block.attention_norm, block.mlp_norm):
            assert jax.eval_shape(norm, x).dtype == F32
        assert jax.eval_shape(lambda h, b=block: b.mlp(h.astype(F16)), x).dtype == F16
    assert jax.eval_shape(model.final_norm, x).dtype == F32

    jaxpr = jax.make_jaxpr(lambda t: model(t)[0])(tokens).jaxpr
    dots = [eqn for eqn in equations(jaxpr) if eqn.primitive.name == "dot_general"]
    # Per block q, k, v, out, q·k, weights·v, the MLP's two; then the readout.
    assert len(dots) == 8 * config.model.num_layers + 1
    assert all(var.aval.dtype == F16 for eqn in dots for var in eqn.invars)

    # The switch is what moves the stream: without it a float16 model's stream is float16.
    plain = model_of(tiny_config(**{"train.dtype": "float16"}), seed=0)
    assert jax.eval_shape(plain.embed, tokens).dtype == F16
    x16 = jax.ShapeDtypeStruct(x.shape, F16)
    assert jax.eval_shape(lambda h: plain.blocks[0](h)[0], x16).dtype == F16


def layer_norm(x, norm):
    """nnx.LayerNorm over the last axis in float32, with its scale and bias."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + norm.epsilon) * norm.scale[...] + norm.bias[...]


def dense(h, layer):
    """A Linear in float16: input, kernel and bias rounded to it."""
    out = h.astype(F16) @ layer.kernel[...].astype(F16)
    return out if layer.bias is None else out + layer.bias[...].astype(F16)


def reference_block(block, x, stream):
    """A pre-norm block by hand: the norms in float32, every matmul in float16, the q·k
    product and softmax in float32 (logits_dtype float32), 1/√d_k; the stream and its
    additions in `stream`."""
    attention = block.attention
    batch, seq, _ = x.shape
    heads, d = attention.num_heads, attention.head_dim

    def split(t):
        return t.reshape(batch, seq, heads, d)  # (B, T, H, D)

    x = x.astype(stream)
    h = layer_norm(x.astype(F32), block.attention_norm)
    q, k, v = (split(dense(h, layer)) for layer in (attention.query, attention.key,
                                                    attention.value))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=F32) / np.sqrt(d)
    logits = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1).astype(F16)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, heads * d)
    x = x + dense(out, attention.out).astype(stream)
    h = layer_norm(x.astype(F32), block.mlp_norm)
    hidden = jax.nn.gelu(dense(h, block.mlp_in).astype(F32))
    return x + dense(hidden, block.mlp_out).astype(stream)


def test_a_block_is_the_hand_written_float32_stream_block():
    config = tiny_config(**MIXED, policy="inv_sqrt_dk")
    block = model_of(config, seed=1).blocks[0]
    rng = np.random.default_rng(1)
    x = jnp.asarray(OFFSET + rng.standard_normal((2, 16, config.model.d_model)), F32)
    got = np.asarray(block(x)[0], np.float64) - np.asarray(x)  # what the sublayers added
    want = np.asarray(reference_block(block, x, F32), np.float64) - np.asarray(x)
    rounded = np.asarray(reference_block(block, x, F16), np.float64) - np.asarray(x)
    tolerance = 2e-3 * np.abs(want).max()  # float16 matmuls: a few ulps (2^-11) apart
    np.testing.assert_allclose(got, want, atol=tolerance)
    assert np.abs(rounded - want).max() > 2 * tolerance  # a float16 stream's 2^-6 would fail


@pytest.mark.parametrize("offset", [0.0, OFFSET])
def test_the_float32_stream_tracks_the_float32_model_where_a_float16_stream_cannot(offset):
    tokens = random_tokens(2)
    models = {}
    for name, overrides in (("float32", {}), ("mixed", MIXED),
                            ("float16", {"train.dtype": "float16"})):
        model = model_of(tiny_config(**overrides), seed=2)
        # The offset on the position table: the token table is the tied readout's too.
        table = model.position_embed.embedding
        table.set_value(table[...] + offset)  # the same parameters in all three
        models[name] = np.asarray(make_forward(model)(tokens), np.float64)
    reference = models["float32"]
    scale = np.abs(reference).max()
    mixed = np.abs(models["mixed"] - reference).max()
    rounded = np.abs(models["float16"] - reference).max()
    assert 1e-5 * scale < mixed < 0.01 * scale  # float16 matmuls' round-off, no more
    if offset:  # the float16 stream has lost what the embedding told tokens apart by
        assert rounded > 10 * mixed


def test_a_float32_stream_under_float32_compute_is_the_plain_model_bit_for_bit():
    tokens = random_tokens(3)
    plain = make_forward(model_of(tiny_config(), seed=3))(tokens)
    marked = make_forward(model_of(tiny_config(**{"model.residual_dtype": "float32"}),
                                   seed=3))(tokens)
    assert np.array_equal(np.asarray(plain), np.asarray(marked))


def test_parameters_stay_float32_and_gradients_flow_through_the_float16_blocks():
    model = model_of(tiny_config(**MIXED), seed=4)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = random_tokens(4)

    def loss(params):
        logits, _ = nnx.merge(graphdef, params, rest)(tokens)
        return jax.nn.logsumexp(logits, -1).mean() - logits[..., 0].mean()

    grads = jax.jit(jax.grad(loss))(params)  # one program: eagerly, each op compiles alone
    leaves = jax.tree.leaves(grads)
    assert all(g.dtype == F32 for g in jax.tree.leaves(params)) and all(
        g.dtype == F32 for g in leaves)
    assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
    mlp_in = grads["blocks"][0]["mlp_in"]["kernel"][...]
    assert np.abs(np.asarray(mlp_in)).max() > 0


def test_a_bad_residual_dtype_is_one_line_naming_the_field():
    with pytest.raises(ConfigError, match=r"^model\.residual_dtype must be one of , float32"):
        validate(tiny_config(**{"model.residual_dtype": "bfloat16"}))


@pytest.mark.parametrize("name,value", [("model.residual_dtype", "float64"),
                                        ("train.loss_scale", -1.0),
                                        ("train.loss_scale_period", -2)])
def test_main_refuses_a_bad_precision_field_in_one_line_exit_2(tmp_path, name, value):
    line = one_error_line(run_module("main", *main_args(tmp_path / "run", **{name: value})))
    assert line.startswith(f"error: {name} must be"), line
    assert not (tmp_path / "run").exists()
