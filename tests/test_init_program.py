"""`run_setup.init_state` (one jitted program per model shape) against the model built eagerly, op
by op, the way a run was initialised before: the same state, bit for bit, and one program for
every scalar policy, seed and learning rate at a shape."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from scale_ablation.model.build import build_model
from scale_ablation.training import run_config, run_setup
from scale_ablation.training.optim import make_optimizer


def eager_state(config) -> tuple:
    """The state built eagerly: the model's constructor runs op by op outside any jit."""
    model = build_model(run_config.model_config(config), nnx.Rngs(params=config.train.seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, {"params": params, "rest": rest,
                      "opt_state": make_optimizer(config).init(params),
                      "step": jnp.zeros((), jnp.int32),
                      "lr": jnp.asarray(config.train.lr, jnp.float32)}


def assert_bitwise_equal(got, want) -> None:
    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(want)
    assert got_tree == want_tree
    for a, b in zip(got_leaves, want_leaves, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("overrides", [
    {"policy": "inv_sqrt_dk", "train.seed": 0},
    {"policy": "const:0.3", "train.seed": 7, "train.lr": 0.02},
    {"policy": "learned:0.5", "model.num_layers": 2},
    {"policy": "qk_layernorm", "model.init": "gpt2"},
    {"policy": "log_length", "model.positions": "rotary", "model.init": "xavier"},
])
def test_jitted_init_is_the_eager_init(overrides):
    config = tiny_config(**overrides)
    graphdef, state = run_setup.init_state(config)
    want_graphdef, want = eager_state(config)
    assert graphdef == want_graphdef
    assert_bitwise_equal(state, want)


def test_one_program_for_every_scalar_policy_seed_and_lr():
    shape = {"model.d_model": 48, "model.num_layers": 2}  # a shape no other test here uses
    before = run_setup.init_compilations()
    for policy, seed, lr in [("none", 0, 1e-3), ("inv_dk", 1, 3e-3), ("const:0.1", 2, 1e-2),
                             ("inv_sqrt_dk", 3, 0.1)]:
        config = tiny_config(policy=policy, **{"train.seed": seed, "train.lr": lr}, **shape)
        _, state = run_setup.init_state(config)
        assert_bitwise_equal(state, eager_state(config)[1])
    assert run_setup.init_compilations() - before == 1
    run_setup.init_state(tiny_config(policy="learned", **shape))  # parameters of its own: another
    assert run_setup.init_compilations() - before == 2
