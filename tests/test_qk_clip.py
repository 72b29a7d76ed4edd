"""QK-clip inside the jitted train step: a head whose largest logit exceeded T comes back to T,
the others are untouched, the largest logit per head is the forward pass's, and it is logged."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from scale_ablation.model import attention, policies, qk_clip
from scale_ablation.model.lm import LanguageModel
from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import steps

HEADS, QK_DIM = 2, 8


def split_model(spec, seed=0):
    config = ModelConfig(d_model=32, num_layers=1, num_heads=HEADS, head_dim=4, qk_dim=QK_DIM,
                         init_gain=3.0, init="gpt2", layer_policies=(spec,))
    config.check()
    return nnx.split(LanguageModel(config, rngs=nnx.Rngs(seed)), nnx.Param, ...)


BATCH = {"inputs": jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 16)), jnp.int32),
         "targets": jnp.asarray(np.random.default_rng(1).integers(0, 256, (4, 16)), jnp.int32),
         "weights": jnp.ones((4, 16), jnp.float32)}


def max_logits(graphdef, params, rest):
    """Each head's largest post-scale logit over visible keys, recomputed in NumPy from the
    layer's q and k (independent of the MaxLogit record)."""
    model = nnx.merge(graphdef, params, rest)
    layer = model.blocks[0].attention
    x = model.embed(BATCH["inputs"]) + model.position_embed(jnp.arange(16))[None]
    x = np.asarray(model.blocks[0].attention_norm(x), np.float64)
    project = lambda p: (x @ np.asarray(p.kernel.get_value(), np.float64)  # noqa: E731
                         + np.asarray(p.bias.get_value(), np.float64)).reshape(4, 16, HEADS, -1)
    logits = np.einsum("bqhd,bkhd->bhqk", project(layer.query), project(layer.key))
    visible = np.tril(np.ones((16, 16), bool))
    return np.where(visible, logits / np.sqrt(QK_DIM), -np.inf).max(axis=(0, 2, 3))


def test_clip_brings_heads_above_threshold_back_to_it():
    graphdef, params, rest = split_model("qk_clip:1e9")
    before = max_logits(graphdef, params, rest)
    assert before[0] != pytest.approx(before[1], rel=0.05)
    threshold = float(before.mean())  # one head above T, one below
    graphdef, params, rest = split_model(f"qk_clip:{threshold}")  # the same weights (seed 0)
    tx = optax.sgd(1.0)
    state = {"params": params, "rest": rest, "opt_state": tx.init(params),
             "step": jnp.int32(0), "lr": jnp.float32(0.0)}  # lr 0: only the clip moves weights
    step = jax.jit(steps.make_train_step(graphdef, tx, 0.0))
    new_state, _ = step(state, BATCH, None)
    recorded = np.asarray(new_state["rest"]["blocks"][0]["attention"]["max_logit"].get_value())
    np.testing.assert_allclose(recorded, before, rtol=1e-4)  # the step's own forward pass
    after = max_logits(graphdef, new_state["params"], new_state["rest"])
    expected = np.minimum(before, threshold)
    np.testing.assert_allclose(after, expected, rtol=1e-4)
    # The clipped head's W_Q columns scaled by √(T/max); the other head's untouched.
    old_q = np.asarray(params["blocks"][0]["attention"]["query"]["kernel"].get_value())
    new_q = np.asarray(new_state["params"]["blocks"][0]["attention"]["query"]["kernel"]
                       .get_value())
    factor = np.sqrt(np.minimum(1.0, threshold / before))
    np.testing.assert_allclose(new_q, old_q * np.repeat(factor, QK_DIM), rtol=1e-5)
    # Logged per head by the diagnostics step: the last train step's largest logits.
    diagnostics = jax.jit(steps.make_diagnostics_step(graphdef))(new_state, BATCH)
    for head in range(HEADS):
        assert float(diagnostics[f"attn/layer0/head{head}/qk_clip_max_logit"]) == pytest.approx(
            recorded[head], rel=1e-5)


def test_factors_leave_heads_at_or_below_threshold_alone():
    factors = qk_clip.factors(jnp.asarray([50.0, 100.0, 400.0, -3.0]), 100.0)
    np.testing.assert_allclose(factors, [1.0, 1.0, 0.5, 1.0])


def test_max_logit_is_taken_before_the_cap():
    q = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5, HEADS, 8)) * 3, jnp.float32)
    k = jnp.asarray(np.random.default_rng(3).standard_normal((2, 5, HEADS, 8)), jnp.float32)
    _, internals = attention.attend(q, k, k, policy=policies.get("softcap:1"),
                                    return_internals=True)
    logits = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64),
                       np.asarray(k, np.float64)) / np.sqrt(8)
    visible = np.tril(np.ones((5, 5), bool))
    expected = np.where(visible, logits, -np.inf).max(axis=(0, 2, 3))
    assert (expected > 1).all()  # above the cap: the record is of the uncapped logit
    np.testing.assert_allclose(internals.max_logit, expected, rtol=1e-5)


def test_models_without_clip_keep_their_step_program():
    graphdef, params, rest = split_model("inv_sqrt_dk")
    assert not qk_clip.applies(graphdef, params, rest)
    assert "max_logit" not in rest["blocks"][0]["attention"]


def test_only_the_train_steps_forward_pass_sows_the_maxima():
    """The train step collects the maxima with `nnx.capture`; any other forward pass (evaluation,
    diagnostics) sows nothing, since a sow outside a capture is deprecated in Flax, and leaves
    the model without an intermediate."""
    graphdef, params, rest = split_model("qk_clip:1.0")
    model = nnx.merge(graphdef, params, rest)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        model(BATCH["inputs"])
        model(BATCH["inputs"], with_diagnostics=True)
    assert not nnx.state(model, nnx.Intermediate)
    logits, maxima = qk_clip.forward(model, BATCH["inputs"], None)
    np.testing.assert_allclose(maxima[0], max_logits(graphdef, params, rest), rtol=1e-4)
    np.testing.assert_allclose(logits, model(BATCH["inputs"])[0], rtol=1e-6)
    assert not nnx.state(model, nnx.Intermediate)  # the capture keeps nothing on the model


def test_clip_without_biases_rescales_the_kernels_alone():
    # fan_in init (the default) has no q/k biases: only the kernels' columns are rescaled.
    config = ModelConfig(d_model=32, num_layers=1, num_heads=HEADS, head_dim=4, qk_dim=QK_DIM,
                         layer_policies=("qk_clip:10",))
    config.check()
    graphdef, params, rest = nnx.split(LanguageModel(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
    new_params, new_rest = qk_clip.after_step(graphdef, params, rest, [jnp.asarray([40.0, 5.0])])
    factor = np.repeat([np.sqrt(10 / 40), 1.0], QK_DIM)  # √(T/max) above T, 1 below
    for name in ("query", "key"):
        old, new = (np.asarray(p["blocks"][0]["attention"][name]["kernel"].get_value())
                    for p in (params, new_params))
        assert "bias" not in new_params["blocks"][0]["attention"][name]
        np.testing.assert_allclose(new, old * factor, rtol=1e-6)
    counts = new_rest["blocks"][0]["attention"]["clip_count"].get_value()
    np.testing.assert_array_equal(np.asarray(counts), [1.0, 0.0])
