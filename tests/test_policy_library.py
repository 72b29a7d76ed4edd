"""The policy library against NumPy: every built-in policy's whole pipeline (q/k transform,
scale, logit stages, weights) on both attention paths, parameter gradients against finite
differences of the NumPy formula, compositions against their parts applied by hand, the fused
path's refusals, and the policies that see the model (head width, layer index)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import policy_reference as ref
import pytest
from flax import nnx

from scale_ablation.errors import ConfigError
from scale_ablation.model import attention, policies
from scale_ablation.model.lm import LanguageModel
from scale_ablation.model.spec import ModelConfig
from scale_ablation.training.optim import OptimizerSettings, make_optimizer

BATCH, SEQ, HEADS, HEAD_DIM = 2, 5, 2, 8
COMPOSED = {  # spec: (first, second)
    "qk_rmsnorm+softcap:2": ("qk_rmsnorm", "softcap:2"),
    "inv_dk+sink": ("inv_dk", "sink"),
    "sink+softcap:2": ("sink", "softcap:2"),
    "cosine+sigmoid": ("cosine", "sigmoid"),
}


def normal(seed, shape, scale=1.0):
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def inputs(q_len=SEQ, k_len=SEQ, qk_dim=HEAD_DIM, v_dim=HEAD_DIM):
    return (normal(1, (BATCH, q_len, HEADS, qk_dim), 2.0), normal(2, (BATCH, k_len, HEADS, qk_dim)),
            normal(3, (BATCH, k_len, HEADS, v_dim)))


def moved_params(policy, head_dim=HEAD_DIM):
    params = policy.init(jax.random.key(0), num_heads=HEADS, head_dim=head_dim)
    leaves, treedef = jax.tree.flatten(params)
    return jax.tree.unflatten(treedef, [p + normal(9 + i, p.shape, 0.3)
                                        for i, p in enumerate(leaves)])


def reference_of(spec):
    if spec in COMPOSED:
        first, second = (policies.get(s) for s in COMPOSED[spec])
        nested = bool(jax.tree.leaves(first.init(jax.random.key(0), num_heads=1, head_dim=2))
                      or jax.tree.leaves(second.init(jax.random.key(0), num_heads=1, head_dim=2)))
        return ref.composed(ref.REFERENCES[COMPOSED[spec][0]], ref.REFERENCES[COMPOSED[spec][1]],
                            nested)
    return ref.REFERENCES[spec]


def numpy_params(params):
    return jax.tree.map(lambda p: np.asarray(p, np.float64), params)


def test_every_built_in_policy_has_a_numpy_reference():
    covered = {spec.partition(":")[0] for spec in ref.REFERENCES}
    built_in = {name for name in policies.available() if not name.startswith(("test_", "pl_"))}
    assert built_in <= covered, built_in - covered


@pytest.mark.parametrize("q_len", [SEQ, 3], ids=["square", "q_shorter"])
@pytest.mark.parametrize("spec", [*ref.REFERENCES, *COMPOSED])
def test_policy_matches_numpy_on_both_paths(spec, q_len):
    policy = policies.get(spec)
    params = moved_params(policy)
    q, k, v = inputs(q_len=q_len)
    expected, weights = ref.attend(reference_of(spec), numpy_params(params), q, k, v)
    out, internals = attention.attend(q, k, v, policy=policy, params=params,
                                      return_internals=True)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(internals.probs, weights, rtol=1e-4, atol=1e-6)
    # The fused path: computed there where it can be, else the reference's fallback.
    fused = attention.attend(q, k, v, policy=policy, params=params, implementation="fused")
    np.testing.assert_allclose(fused, expected, rtol=1e-4, atol=1e-5)


PARAMETERISED = ["learned", "learned_per_head", "qk_layernorm", "qk_rmsnorm",
                 "qk_layernorm_global", "cosine", "log_length", "sink", "inv_dk+sink",
                 "sink+softcap:2", "cosine+sigmoid"]


@pytest.mark.parametrize("spec", PARAMETERISED)
def test_parameter_gradients_match_numpy_finite_differences(spec):
    policy = policies.get(spec)
    params = moved_params(policy)
    q, k, v = inputs()
    cotangent = np.asarray(normal(4, v.shape), np.float64)
    reference = reference_of(spec)

    def numpy_loss(flat_params):
        out, _ = ref.attend(reference, flat_params, q, k, v)
        return float((out * cotangent).sum())

    grads = jax.grad(lambda p: (attention.attend(q, k, v, policy=policy, params=p)
                                * jnp.asarray(cotangent, jnp.float32)).sum())(params)
    base = numpy_params(params)
    for path, grad in jax.tree_util.tree_leaves_with_path(grads):
        leaf = np.asarray(base[path[0].key] if len(path) == 1 else
                          base[path[0].key][path[1].key])
        numeric = np.zeros_like(leaf)
        for index in np.ndindex(leaf.shape):
            for sign in (1, -1):
                moved = jax.tree.map(np.copy, base)
                target = moved[path[0].key] if len(path) == 1 else moved[path[0].key][path[1].key]
                target[index] += sign * 1e-5
                numeric[index] += sign * numpy_loss(moved) / 2e-5
        np.testing.assert_allclose(grad, numeric, rtol=2e-3, atol=2e-4, err_msg=str(path))


# --------------------------------------------------------------------------- compositions


def test_composition_applies_first_transform_and_scale_then_second_logit_stage():
    """`qk_rmsnorm+softcap:2` by hand: normalise q, k with the gains, scale 1/√d, cap at 2."""
    policy = policies.get("qk_rmsnorm+softcap:2")
    params = moved_params(policy)
    q, k, v = inputs()
    gains = numpy_params(params)["first"]  # the parts' parameters nest
    qn = ref.rms_norm(np.asarray(q, np.float64), (-1,), 1e-6) * gains["q_gain"]
    kn = ref.rms_norm(np.asarray(k, np.float64), (-1,), 1e-6) * gains["k_gain"]
    logits = 2 * np.tanh(np.einsum("bqhd,bkhd->bhqk", qn, kn) / math.sqrt(HEAD_DIM) / 2)
    visible = np.tril(np.ones((SEQ, SEQ), bool))
    expected = np.einsum("bhqk,bkhd->bqhd", ref.softmax(logits, visible), v)
    np.testing.assert_allclose(attention.attend(q, k, v, policy=policy, params=params),
                               expected, rtol=1e-4, atol=1e-5)
    # Parameter-free parts give a parameter-free composition that shares programs.
    assert policies.get("inv_dk+softcap:2") == policies.get("inv_sqrt_dk+softcap:2")
    assert policies.get("inv_dk+softcap:2").base_scale(16) == pytest.approx(1 / 16)


@pytest.mark.parametrize(("spec", "says"), [
    ("softcap:2+qk_rmsnorm", "only the first"),
    ("qk_rmsnorm+inv_dk", "no logit transform"),
    ("softcap:2+softcap:3", "both policies transform the scaled logits"),
    ("sigmoid+sink", "both policies replace the softmax"),
    ("inv_dk+qk_clip", "only the first"),
])
def test_impossible_compositions_are_one_line(spec, says):
    with pytest.raises(ValueError, match=says) as info:
        policies.get(spec)
    assert "\n" not in str(info.value) and spec in str(info.value)


# --------------------------------------------------------------------------- the fused path


def model(spec, **fields):
    fields = {"d_model": 32, "num_layers": 2, "num_heads": HEADS, "head_dim": HEAD_DIM,
              "layer_policies": (spec, spec), **fields}
    return ModelConfig(**fields)


@pytest.mark.parametrize("spec", ["softcap:30", "sigmoid", "sink", "qk_clip:50",
                                  "logit_layernorm", "qk_rmsnorm+softcap:30"])
def test_fused_refuses_what_the_kernel_cannot_express_in_one_line(spec):
    with pytest.raises(ConfigError, match=r"model\.attention_impl=fused cannot") as info:
        model(spec, attention_impl="fused").check()
    assert "\n" not in str(info.value)
    model(spec).check()  # the reference path takes it


@pytest.mark.parametrize("spec", ["cosine", "qk_rmsnorm_nogain", "qk_layernorm_global",
                                  "temperature", "yarn:8", "inv_layer", "inv_sqrt_head_width"])
def test_fused_takes_what_folds_into_q(spec):
    model(spec, attention_impl="fused").check()


# --------------------------------------------------------------------------- the model's dims


def test_inv_layer_and_head_width_see_the_model_and_share_one_program():
    config = model("inv_layer:2", d_model=48, num_heads=HEADS, qk_dim=16)
    config.check()
    lm = LanguageModel(config, rngs=nnx.Rngs(0))
    scales = [float(block.attention.base_scale.get_value()) for block in lm.blocks]
    np.testing.assert_allclose(scales, [1 / 4, 1 / (4 * 2**2)], rtol=1e-6)  # d_k = 16
    np.testing.assert_allclose(config.base_scales(), scales, rtol=1e-6)
    width = model("inv_sqrt_head_width", d_model=48, qk_dim=16)
    np.testing.assert_allclose(width.base_scales(), [1 / math.sqrt(24)] * 2, rtol=1e-6)
    plain = LanguageModel(model("inv_sqrt_dk", d_model=48, qk_dim=16), rngs=nnx.Rngs(0))
    assert nnx.split(lm)[0] == nnx.split(plain)[0]  # the numbers are state, not structure


def test_temperature_is_per_query_position():
    scale = attention.query_scale(policies.get("temperature:2,0.3"), {}, q_len=6, k_len=6,
                                  num_heads=HEADS, head_dim=16, causal=True)
    expected = [(0.3 * math.log(1 + (p + 1) // 2) + 1) / 4 for p in range(6)]
    np.testing.assert_allclose(scale[:, 0], expected, rtol=1e-6)


def test_cosine_logit_scale_is_not_weight_decayed():
    """optim.py decays leaves of two dimensions or more; ℓ is one per head."""
    lm = LanguageModel(model("cosine"), rngs=nnx.Rngs(0))
    params = nnx.state(lm, nnx.Param)
    tx = make_optimizer(OptimizerSettings(steps=10, warmup_steps=0, grad_clip=0,
                                          weight_decay=0.5))
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    flat = {jax.tree_util.keystr(path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(updates)}
    ell = [leaf for path, leaf in flat.items() if "logit_scale" in path]
    kernels = [leaf for path, leaf in flat.items() if "kernel" in path]
    assert len(ell) == 2 and all(float(jnp.abs(leaf).max()) == 0 for leaf in ell)
    assert kernels and all(float(jnp.abs(leaf).max()) > 0 for leaf in kernels)  # decay acts


def test_sigmoid_bias_defaults_to_minus_log_sequence_length():
    q, k, v = inputs()
    _, internals = attention.attend(q, k, v, policy=policies.get("sigmoid"),
                                    return_internals=True)
    logits = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64),
                       np.asarray(k, np.float64)) / math.sqrt(HEAD_DIM)
    visible = np.tril(np.ones((SEQ, SEQ), bool))
    np.testing.assert_allclose(internals.probs,
                               np.where(visible, 1 / (1 + SEQ * np.exp(-logits)), 0),
                               rtol=1e-5, atol=1e-7)


def test_optimizer_step_reaches_policy_params():
    """A step moves every policy parameter (sanity for the gradient tests above)."""
    q, k, v = inputs()

    def total(params, policy):
        return attention.attend(q, k, v, policy=policy, params=params).sum()

    for spec in ("sink", "cosine", "qk_layernorm_global"):
        policy = policies.get(spec)
        params = moved_params(policy)
        grads = jax.grad(total)(params, policy)
        stepped = optax.apply_updates(params, jax.tree.map(lambda g: -0.1 * g, grads))
        for a, b in zip(jax.tree.leaves(stepped), jax.tree.leaves(params), strict=True):
            assert not np.allclose(a, b), spec
