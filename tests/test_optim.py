"""The optimiser against independent references: which parameters decay (by name and by effect),
the schedule against its closed form, and AdamW with clipping against a NumPy implementation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_model import tiny_config

from scale_ablation.training import optim, run_setup
from scale_ablation.training.optim import OptimizerSettings

# Parameters whose names say they are weight matrices: the only ones weight decay may shrink.
DECAYED_NAMES = ("kernel", "embedding")


def closed_form_multiplier(step: int, steps: int, warmup: int) -> float:
    """Linear warmup 0 -> 1 over `warmup` steps, then cosine from 1 down to 0.1 at `steps`."""
    if step < warmup:
        return step / warmup
    progress = min((step - warmup) / (steps - warmup), 1.0)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def named_leaves(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def is_decayed_by_name(name: str) -> bool:
    return any(f"['{word}']" in name for word in DECAYED_NAMES)


@pytest.fixture(scope="module")
def model_params():
    """A tiny model's parameters with every kind of leaf: kernels, biases, norm gains, a learned
    per-head scale."""
    config = tiny_config(**{"policy": "learned_per_head", "model.num_layers": 1})
    _, state = run_setup.init_state(config)
    return state["params"]


def test_the_model_has_every_kind_of_parameter(model_params):
    names = named_leaves(model_params)
    for part in ("['kernel']", "['embedding']", "['bias']", "['scale']", "['policy_params']"):
        assert any(part in name for name in names), part


def test_weight_decay_shrinks_matrices_only(model_params):
    """Zero gradients: Adam's step is exactly 0, so the whole update is the decay term
    -multiplier·wd·p. Matrices shrink by it; biases, norm gains and policy parameters stay."""
    weight_decay = 0.1
    tx = optim.make_optimizer(OptimizerSettings(steps=10, warmup_steps=0, grad_clip=1.0,
                                                weight_decay=weight_decay))
    zeros = jax.tree.map(jnp.zeros_like, model_params)
    updates, _ = tx.update(zeros, tx.init(model_params), model_params)
    params, got = named_leaves(model_params), named_leaves(updates)
    decayed = [name for name in params if is_decayed_by_name(name)]
    assert decayed and len(decayed) < len(params)
    for name, value in params.items():
        if is_decayed_by_name(name):  # multiplier 1 at step 0 without warmup
            np.testing.assert_allclose(got[name], -weight_decay * value, rtol=1e-6, err_msg=name)
            assert np.abs(got[name]).max() > 0, name
        else:
            np.testing.assert_array_equal(got[name], 0.0, err_msg=name)


@pytest.mark.parametrize("steps,warmup", [(100, 10), (37, 5), (20, 0)])
def test_schedule_matches_its_closed_form(steps, warmup):
    schedule = optim.lr_multiplier(OptimizerSettings(steps, warmup, 1.0, 0.0))
    middle = warmup + (steps - warmup) // 2
    points = {"start": 0, "warmup end": warmup, "mid-way": middle, "last step": steps - 1,
              "end": steps, "half warmup": warmup // 2}
    for label, step in points.items():
        assert float(schedule(step)) == pytest.approx(
            closed_form_multiplier(step, steps, warmup), abs=1e-6), label
    assert float(schedule(steps)) == pytest.approx(0.1, abs=1e-6)
    assert float(schedule(warmup)) == pytest.approx(1.0, abs=1e-6)


def test_the_optimiser_applies_the_schedule(model_params):
    """By effect: with zero gradients a matrix's update at step s is -multiplier(s)·wd·p."""
    settings = OptimizerSettings(steps=12, warmup_steps=4, grad_clip=0.0, weight_decay=0.5)
    tx = optim.make_optimizer(settings)
    params = {"kernel": jnp.ones((3, 4), jnp.float32)}
    opt_state = tx.init(params)
    for step in range(settings.steps + 1):
        updates, opt_state = tx.update({"kernel": jnp.zeros((3, 4))}, opt_state, params)
        expected = -closed_form_multiplier(step, settings.steps, settings.warmup_steps) * 0.5
        np.testing.assert_allclose(updates["kernel"], expected, atol=1e-6, err_msg=str(step))


def numpy_adamw(grads: list[dict], params: dict, settings: OptimizerSettings) -> list[dict]:
    """The updates of AdamW(b1=0.9, b2=0.95, eps=1e-8) after global-norm clipping, decoupled
    decay on ndim >= 2 leaves, times the schedule's closed form: written out step by step."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    out = []
    for step, grad in enumerate(grads):
        norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grad.values()))
        clip = settings.grad_clip
        factor = clip / norm if clip > 0 and norm > clip else 1.0
        multiplier = closed_form_multiplier(step, settings.steps, settings.warmup_steps)
        update = {}
        for name, g in grad.items():
            g = g * factor
            m[name] = 0.9 * m[name] + 0.1 * g
            v[name] = 0.95 * v[name] + 0.05 * g * g
            m_hat, v_hat = m[name] / (1 - 0.9 ** (step + 1)), v[name] / (1 - 0.95 ** (step + 1))
            adam = m_hat / (np.sqrt(v_hat) + 1e-8)
            decay = settings.weight_decay * params[name] if params[name].ndim >= 2 else 0.0
            update[name] = -multiplier * (adam + decay)
        out.append(update)
    return out


@pytest.mark.parametrize("grad_clip", [1.0, 0.0], ids=["clipped", "unclipped"])
def test_adamw_with_clipping_matches_numpy(grad_clip):
    settings = OptimizerSettings(steps=8, warmup_steps=2, grad_clip=grad_clip, weight_decay=0.1)
    rng = np.random.default_rng(0)
    params = {"kernel": rng.standard_normal((3, 4)).astype(np.float32),
              "bias": rng.standard_normal(4).astype(np.float32)}
    # Gradient norms from 0.01 to 100: clipping changes Adam's moments only when the scale
    # varies from step to step (Adam alone is invariant to one constant scale).
    scales = [100.0, 0.01, 3.0, 0.5, 50.0, 0.1, 1.0, 10.0]
    grads = [{k: (s * rng.standard_normal(p.shape)).astype(np.float32) for k, p in params.items()}
             for s in scales]
    expected = numpy_adamw(grads, params, settings)
    tx = optim.make_optimizer(settings)
    opt_state = tx.init(params)
    for step, grad in enumerate(grads):
        updates, opt_state = tx.update(grad, opt_state, params)
        for name in params:
            np.testing.assert_allclose(updates[name], expected[step][name], rtol=2e-4,
                                       atol=1e-6, err_msg=f"{name} at step {step}")


def one_step_change(config, multiplier: float) -> dict[str, np.ndarray]:
    """Each parameter's change over one real train step of `config` with the given scale-policy
    LR multiplier (same initial state, batch and everything else)."""
    from scale_ablation.training import steps
    config = tiny_config(**{**config, "train.scale_lr_multiplier": multiplier,
                            "train.warmup_steps": 0})
    settings = OptimizerSettings.of(config)
    assert settings.scale_lr_multiplier == multiplier
    graphdef, state = run_setup.init_state(config)
    before = named_leaves(state["params"])
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, (config.train.batch_size, config.data.seq_len + 1))
    batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
             "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
             "weights": jnp.ones((config.train.batch_size, config.data.seq_len), jnp.float32)}
    step = steps.make_train_step(graphdef, optim.make_optimizer(settings), 0.0)
    new_state, _ = jax.jit(step)(state, batch, jax.random.key(0))
    after = named_leaves(new_state["params"])
    return {name: after[name] - before[name] for name in before}


def test_scale_lr_multiplier_scales_the_policy_parameters_only():
    """With multiplier m the scale policy's parameters move m times as far on the first step
    (Adam's first step is ±lr whatever the gradient's size, so m shows directly); every other
    parameter moves exactly as with m = 1."""
    multiplier, model = 7.0, {"policy": "learned_per_head", "model.num_layers": 1}
    default, scaled = one_step_change(model, 1.0), one_step_change(model, multiplier)
    policy_leaves = [name for name in default if "['policy_params']" in name]
    assert policy_leaves and len(policy_leaves) < len(default)
    for name in default:
        if name in policy_leaves:
            assert np.abs(default[name]).min() > 0, name
            np.testing.assert_allclose(scaled[name], multiplier * default[name], rtol=1e-4,
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(scaled[name], default[name], err_msg=name)


def test_scale_lr_multiplier_one_is_todays_optimiser(model_params):
    """Multiplier 1 builds the very optimiser of configs that predate the field: same state
    structure (earlier checkpoints restore) and the same updates bit for bit."""
    old = optim.make_optimizer(OptimizerSettings(steps=10, warmup_steps=2, grad_clip=1.0,
                                                 weight_decay=0.1))
    new = optim.make_optimizer(OptimizerSettings(steps=10, warmup_steps=2, grad_clip=1.0,
                                                 weight_decay=0.1, scale_lr_multiplier=1.0))
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.3), model_params)
    old_state, new_state = old.init(model_params), new.init(model_params)
    assert jax.tree.structure(old_state) == jax.tree.structure(new_state)
    old_updates, _ = old.update(grads, old_state, model_params)
    new_updates, _ = new.update(grads, new_state, model_params)
    for name, value in named_leaves(old_updates).items():
        np.testing.assert_array_equal(named_leaves(new_updates)[name], value, err_msg=name)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_scale_lr_multiplier_must_be_positive(value):
    from scale_ablation.errors import ConfigError
    from scale_ablation.training.run_config import validate
    with pytest.raises(ConfigError, match=r"^train\.scale_lr_multiplier must be a positive"):
        validate(tiny_config(**{"train.scale_lr_multiplier": value}))
