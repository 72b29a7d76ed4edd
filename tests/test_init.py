
"""Initialisation schemes (`model.init`): the std of every projection against its closed form, at
a shape where the schemes differ (num_heads·head_dim != d_model, 3 layers), and the gpt2 model
against the independent PyTorch reference in `benchmarks/reference_gpt2.py` (same weights, same
logits), so a training difference between the two can only come from the init."""

import math
import pathlib
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import copy_into_reference, require

from scale_ablation.model.build import build_model
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import run_config

REPO = pathlib.Path(__file__).resolve().parents[1]
D_MODEL, HEADS, HEAD_DIM, LAYERS, MLP = 64, 2, 96, 3, 4
INNER = HEADS * HEAD_DIM  # 192: fan_in, xavier and gpt2 all give different stds here



def model_of(config, rngs):
    return build_model(run_config.model_config(config), rngs)

def config(init: str, **overrides):
    base = experiment.load_config(str(REPO / "experiments" / "base.py") + ":quick")
    fields = {"model.d_model": D_MODEL, "model.num_heads": HEADS, "model.head_dim": HEAD_DIM,
              "model.num_layers": LAYERS, "model.mlp_ratio": MLP, "model.init": init,
              "model.max_seq_len": 64, "data.seq_len": 32}
    return experiment.apply_overrides(base, {**fields, **overrides})


def expected_std(init: str, fan_in: int, fan_out: int, residual: bool) -> float:
    """The closed forms: fan_in 1/√fan_in; xavier √(2/(fan_in+fan_out)); gpt2 0.02, or
    0.02/√(2·layers) for a projection that writes into the residual stream."""
    if init == "fan_in":
        return 1 / math.sqrt(fan_in)
    if init == "xavier":
        return math.sqrt(2 / (fan_in + fan_out))
    return 0.02 / math.sqrt(2 * LAYERS) if residual else 0.02


# (path, fan_in, fan_out, writes into the residual stream)
PROJECTIONS = [
    (("attention", "query"), D_MODEL, INNER, False),
    (("attention", "key"), D_MODEL, INNER, False),
    (("attention", "value"), D_MODEL, INNER, False),
    (("attention", "out"), INNER, D_MODEL, True),
    (("mlp_in",), D_MODEL, MLP * D_MODEL, False),
    (("mlp_out",), MLP * D_MODEL, D_MODEL, True),
]


@pytest.mark.parametrize("init", ["fan_in", "xavier", "gpt2"])
def test_projection_stds_match_the_closed_form(init):
    model = model_of(config(init), nnx.Rngs(params=0))
    for block in model.blocks:
        for path, fan_in, fan_out, residual in PROJECTIONS:
            layer = block
            for name in path:
                layer = getattr(layer, name)
            kernel = np.asarray(layer.kernel[...])
            assert kernel.shape == (fan_in, fan_out)
            want = expected_std(init, fan_in, fan_out, residual)
            # ≥ 12k samples per matrix: the sample std is within ~1% of the true one.
            assert kernel.std() == pytest.approx(want, rel=0.05), (init, path)
            assert abs(kernel.mean()) < 4 * want / math.sqrt(kernel.size)


@pytest.mark.parametrize("init,want", [("fan_in", 1 / math.sqrt(D_MODEL)),
                                       ("xavier", 1 / math.sqrt(D_MODEL)), ("gpt2", 0.02)])
def test_token_embedding_std(init, want):
    model = model_of(config(init), nnx.Rngs(params=0))
    assert float(jnp.std(model.embed.embedding[...])) == pytest.approx(want, rel=0.05)
    assert float(jnp.std(model.position_embed.embedding[...])) == pytest.approx(0.02, rel=0.05)


def test_attention_biases_only_under_gpt2():
    for init, has_bias in (("fan_in", False), ("xavier", False), ("gpt2", True)):
        attention = model_of(config(init), nnx.Rngs(params=0)).blocks[0].attention
        for layer in (attention.query, attention.key, attention.value, attention.out):
            assert (layer.bias is not None) == has_bias, init
            if has_bias:
                np.testing.assert_array_equal(layer.bias[...], 0.0)


def test_init_gain_scales_gpt2_query_and_key_only():
    attention = model_of(config("gpt2", **{"model.init_gain": 3.0}),
                            nnx.Rngs(params=1)).blocks[0].attention
    assert float(jnp.std(attention.query.kernel[...])) == pytest.approx(0.06, rel=0.05)
    assert float(jnp.std(attention.key.kernel[...])) == pytest.approx(0.06, rel=0.05)
    assert float(jnp.std(attention.value.kernel[...])) == pytest.approx(0.02, rel=0.05)


def test_unknown_init_is_rejected():
    with pytest.raises(ValueError, match=r"model\.init"):
        model_of(config("gpt3"), nnx.Rngs(params=0))


def test_kernel_init_itself_refuses_an_unknown_kind():
    # Past the config's check: a layer built with a kind the three closed forms do not name.
    from scale_ablation.model import initializers

    with pytest.raises(ValueError, match=r"^model\.init must be one of fan_in, xavier, gpt2, "
                                         r"got 'kaiming'$"):
        initializers.kernel_init("kaiming")


def test_gpt2_model_computes_the_reference_function():
    torch = require("torch")
    from benchmarks import reference_gpt2

    seq = 24
    model = model_of(config("gpt2", **{"model.mlp_ratio": 4}), nnx.Rngs(params=2))
    # Random non-zero biases and norm parameters, so that each one's placement is checked.
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(5), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    nnx.update(model, jax.tree.unflatten(treedef, leaves))
    args = SimpleNamespace(d_model=D_MODEL, heads=HEADS, head_dim=HEAD_DIM, layers=LAYERS,
                           seq_len=seq, no_attn_bias=False, init="gpt2", std=[])
    torch.manual_seed(0)
    reference = reference_gpt2.GPT(args)
    copy_into_reference(model, reference)

    tokens = np.random.default_rng(3).integers(0, 256, size=(3, seq))
    ours = np.asarray(model(jnp.asarray(tokens))[0])
    with torch.no_grad():
        theirs = reference(torch.from_numpy(tokens).long()).numpy()
    assert np.abs(theirs).max() > 1.0  # logits of a real size, not a degenerate match
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
