"""Loss scaling (`training.loss_scaling`) against laws and uninterrupted runs.

Scaling the loss and unscaling the gradients cancel, so in float32 a statically scaled step is
the unscaled step to round-off; a dynamic scale follows jmp's rule, checked step by step against a
count kept here; an overflow is made the way float16 makes one (a scale so large that the
float16 cotangents overflow while the float32 loss stays finite), and must skip the step, halve
the scale and leave the parameters as they were; a preempted run and a preempted ensemble
resume to the very numbers of uninterrupted ones, each member with its own scale.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import QUICK, TINY_MODEL
from test_steps import assert_bitwise_equal, batch_of

from scale_ablation.records.checkpoints import Checkpoints
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import hooks, loss_scaling, run_setup, steps, train
from scale_ablation.training.optim import OptimizerSettings, make_optimizer

TINY = {**TINY_MODEL, "train.steps": 20, "train.log_every": 1, "train.eval_every": 10,
        "train.diag_every": 0, "checkpoint.every": 10, "wandb.mode": "disabled"}
FLOAT16 = {"train.dtype": "float16", "model.residual_dtype": "float32"}
OVERFLOWING = 2.0**40  # float16 cotangents overflow (max 65504); the float32 loss does not


def config_of(**overrides):
    return experiment.apply_overrides(experiment.load_config(QUICK), {**TINY, **overrides})


def step_of(config, z_loss: float = 0.0):
    """The jitted train step a run of `config` trains with (its optimiser and scaling)."""
    graphdef, state = run_setup.init_state(config)
    settings = OptimizerSettings.of(config)
    step = jax.jit(steps.make_train_step(graphdef, make_optimizer(settings), z_loss,
                                         settings.loss_scaling))
    return step, state


def with_scale(state, scale: float, good_steps: int = 0):
    opt_state = state["opt_state"]._replace(scale=jnp.float32(scale),
                                            good_steps=jnp.int32(good_steps))
    return {**state, "opt_state": opt_state}


@pytest.mark.parametrize("scale", [2.0**10, 2.0**-3, 1000.0])
def test_a_static_scale_cancels_the_scaled_step_is_the_unscaled_one(scale):
    """Scaling the loss and unscaling the gradients cancel: in float32 (no underflow to
    rescue) the step is the unscaled one to round-off, the logged gradient norm the unscaled
    gradients'. (Not bit for bit even for 2^k: XLA compiles the two programs' divisions and
    fusions apart, and the gradients differ in their last bit.)"""
    no_warmup = {"train.warmup_steps": 0}  # a real update at step 0
    plain, state = step_of(config_of(**no_warmup))
    scaled, _ = step_of(config_of(**no_warmup, **{"train.loss_scale": scale}))
    batch, key = batch_of(config_of(), 0), steps.dropout_key(0, 0)
    want, want_metrics = plain(state, batch, key)
    got, got_metrics = scaled(state, batch, key)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)  # round-off against each leaf's own size
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
    assert float(got_metrics["train/loss_scale"]) == scale
    assert float(want_metrics["train/loss_scale"]) == 1.0
    assert float(want_metrics["train/update_norm"]) > 0
    for name in ("train/loss", "train/grad_norm", "train/update_norm"):
        assert float(got_metrics[name]) == pytest.approx(float(want_metrics[name]), rel=1e-6)


def test_the_dynamic_transform_skips_an_inf_and_halves_then_grows_after_its_period():
    """The optax wrapper alone, on an injected inf, against jmp's rule counted by hand."""
    scaling = loss_scaling.LossScaling(scale=8.0, period=3)
    tx = loss_scaling.dynamic_loss_scale(optax.adam(0.1), scaling)
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    good, bad = {"w": jnp.ones(3)}, {"w": jnp.array([1.0, jnp.inf, 1.0])}
    expected_scale, run_of_good = 8.0, 0
    for grads in (good, bad, good, good, good, good, bad, bad, bad, bad, bad):
        finite = bool(np.isfinite(np.asarray(grads["w"])).all())
        updates, new = tx.update(grads, state, params)
        if finite:
            run_of_good += 1
            if run_of_good == scaling.period:
                expected_scale, run_of_good = expected_scale * 2, 0
            assert np.abs(np.asarray(updates["w"])).min() > 0
        else:
            expected_scale, run_of_good = max(expected_scale / 2, loss_scaling.MIN_SCALE), 0
            assert np.array_equal(np.asarray(updates["w"]), np.zeros(3))
            assert_bitwise_equal(new.inner, state.inner)  # Adam's moments and count kept
        assert float(new.scale) == expected_scale and int(new.good_steps) == run_of_good
        state = new
    assert float(state.scale) == loss_scaling.MIN_SCALE  # five halvings from 8 stop at 1


def test_a_float16_overflow_skips_the_step_halves_the_scale_and_keeps_the_parameters():
    config = config_of(**FLOAT16, **{"train.loss_scale_period": 4})
    step, state = step_of(config)
    assert float(state["opt_state"].scale) == loss_scaling.DYNAMIC_START  # loss_scale 0
    state = with_scale(state, OVERFLOWING, good_steps=2)
    after, metrics = step(state, batch_of(config, 2), steps.dropout_key(0, 0))
    assert bool(metrics["train/finite"]) and np.isfinite(float(metrics["train/loss"]))
    assert not np.isfinite(float(metrics["train/grad_norm"]))  # the overflow was real
    assert float(metrics["train/loss_scale"]) == OVERFLOWING
    assert float(after["opt_state"].scale) == OVERFLOWING / 2
    assert int(after["opt_state"].good_steps) == 0
    assert int(after["step"]) == int(state["step"]) + 1  # the batch is used up, the run goes on
    assert_bitwise_equal(jax.device_get(after["params"]), jax.device_get(state["params"]))
    assert_bitwise_equal(jax.device_get(after["opt_state"].inner),
                         jax.device_get(state["opt_state"].inner))


def test_good_float16_steps_grow_the_scale_after_the_period_and_update_the_parameters():
    config = config_of(**FLOAT16, **{"train.loss_scale": 256.0, "train.loss_scale_period": 3,
                                     "train.warmup_steps": 0})  # lr 0 at a warmup's step 0
    step, state = step_of(config)
    scales = []
    for index in range(7):
        before = state["params"]
        state, metrics = step(state, batch_of(config, 10 + index), steps.dropout_key(0, index))
        assert bool(metrics["train/finite"]) and np.isfinite(float(metrics["train/grad_norm"]))
        scales.append(float(metrics["train/loss_scale"]))
        moved = [not np.array_equal(np.asarray(a), np.asarray(b))
                 for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(before),
                                 strict=True)]
        assert any(moved)
    assert scales == [256.0] * 3 + [512.0] * 3 + [1024.0]
    assert float(state["opt_state"].scale) == 1024.0 and int(state["opt_state"].good_steps) == 1


def test_an_overflow_at_the_minimum_scale_is_a_divergence_and_leaves_the_state():
    """At MIN_SCALE scaling cannot back off further: as without scaling, the run has diverged.
    A z-loss of 1e30 overflows the float16 cotangents at any scale >= 1 while the loss (and the
    float32 loss with z-loss, ~1e31) stays finite."""
    config = config_of(**FLOAT16, **{"train.loss_scale_period": 2})
    step, state = step_of(config, z_loss=1e30)
    batch, key = batch_of(config, 3), steps.dropout_key(0, 0)
    above, metrics = step(with_scale(state, 2 * loss_scaling.MIN_SCALE), batch, key)
    assert bool(metrics["train/finite"])  # above the minimum: skipped, halved
    assert not np.isfinite(float(metrics["train/grad_norm"]))
    assert float(above["opt_state"].scale) == loss_scaling.MIN_SCALE
    at_minimum, metrics = step(above, batch, key)
    assert not bool(metrics["train/finite"]) and np.isfinite(float(metrics["train/loss"]))
    assert_bitwise_equal(jax.device_get(at_minimum), jax.device_get(above))


def test_a_non_finite_loss_is_a_divergence_whatever_the_scale():
    config = config_of(**FLOAT16, **{"train.loss_scale_period": 2})
    step, state = step_of(config)
    after, metrics = step(state, batch_of(config, 3, poison=True), steps.dropout_key(0, 0))
    assert float(metrics["train/loss_scale"]) > loss_scaling.MIN_SCALE
    assert not bool(metrics["train/finite"])
    assert_bitwise_equal(jax.device_get(after), jax.device_get(state))


@pytest.mark.parametrize("backend", ["cpu", "gpu"], ids=["lax_map", "vmap"])
def test_each_ensemble_member_has_its_own_scale(backend):
    """One member overflows (skipped, halved), its neighbour steps as it would alone."""
    config = config_of(**FLOAT16, **{"train.loss_scale_period": 4})
    graphdef, state = run_setup.init_state(config)
    settings = OptimizerSettings.of(config)
    solo = steps.make_train_step(graphdef, make_optimizer(settings), 0.0, settings.loss_scaling)
    members = jax.jit(steps.over_members(solo, backend))
    stack = lambda *trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees)  # noqa: E731
    states = stack(with_scale(state, OVERFLOWING), with_scale(state, 64.0, good_steps=3))
    batch = batch_of(config, 4)
    keys = jnp.stack([steps.dropout_key(0, 0)] * 2)
    after, metrics = members(states, stack(batch, batch), keys)
    assert np.asarray(metrics["train/finite"]).tolist() == [True, True]
    assert np.asarray(after["opt_state"].scale).tolist() == [OVERFLOWING / 2, 128.0]
    skipped, stepped = (jax.tree.map(lambda x, i=i: x[i], after) for i in (0, 1))
    assert_bitwise_equal(jax.device_get(skipped["params"]), jax.device_get(state["params"]))
    want, _ = jax.jit(solo)(with_scale(state, 64.0, good_steps=3), batch, keys[1])
    for got, expected in zip(jax.tree.leaves(stepped), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- resuming

# float16 from 2^15 doubling every 3 finite steps: the tiny model overflows within 20 steps, so
# the scale both grows and backs off across the checkpoint at step 7.
DYNAMIC = {**FLOAT16, "train.loss_scale_period": 3}
PREEMPT_AT = 7


def scale_history(workdir) -> list[float]:
    return [row["train/loss_scale"] for row in RunFiles(workdir).read_metrics()
            if "train/loss_scale" in row]


def final_state(workdir, config):
    _, like = run_setup.init_state(config)
    checkpoints = Checkpoints(workdir)
    try:
        return checkpoints.restore(checkpoints.latest_step(), like)
    finally:
        checkpoints.close()


def timeless(workdir) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("perf/")}
            for row in RunFiles(workdir).read_metrics()]


@pytest.mark.parametrize("members", [1, 2], ids=["solo", "ensemble"])
def test_a_preempted_run_resumes_to_the_uninterrupted_run_scale_and_all(tmp_path, members):
    configs = [config_of(**DYNAMIC, **{"train.seed": seed, "train.lr": lr})
               for seed, lr in ((0, 3e-3), (1, 1e-2))[:members]]
    names = [f"m{index}" for index in range(members)]
    whole = [tmp_path / "whole" / name for name in names]
    train.train_runs(configs, whole)
    resumed = [tmp_path / "resumed" / name for name in names]
    stopped = train.train_runs(configs, resumed, extra_hooks=[hooks.signal_at(str(PREEMPT_AT))])
    assert all(s["status"] == "preempted" for s in stopped)
    train.train_runs(configs, resumed)
    for got, want, config in zip(resumed, whole, configs, strict=True):
        history = scale_history(want)
        assert len(set(history)) > 2 and any(b < a for a, b in itertools.pairwise(history))
        assert timeless(got) == timeless(want)  # every row, the scale's among them
        assert_bitwise_equal(final_state(got, config), final_state(want, config))


def test_runs_made_before_loss_scaling_resume_under_the_new_defaults():
    """A config.json without the new fields is the same run as today's defaults."""
    from scale_ablation.training import run_config

    new = config_of().to_dict()
    old = config_of().to_dict()
    del old["train"]["loss_scale"], old["train"]["loss_scale_period"]
    del old["model"]["residual_dtype"]
    assert run_config.changed_identity_fields(old, new) == []
    scaled = config_of(**{"train.loss_scale": 8.0}).to_dict()
    assert run_config.changed_identity_fields(old, scaled) == ["train.loss_scale"]
    assert OptimizerSettings.of(config_of()).loss_scaling == loss_scaling.NONE
