"""μP against the mup package itself (microsoft/mup): the same small Transformer in PyTorch with
mup's MuSharedReadout, set_base_shapes, mup.init and MuAdamW; per parameter, the init std, the
Adam LR multiplier and the decay, and the readout's output. Plus: μP at its base width is SP
bit for bit, and mup_inv_dk is mup's attn_mult/d_k."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import require, tiny_config

from scale_ablation.errors import ConfigError
from scale_ablation.model import parametrization, policies
from scale_ablation.model.build import build_model
from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import optim, run_config, run_setup, steps

BASE = {"model.d_model": 32, "model.head_dim": 16}
WIDE = {"model.d_model": 128, "model.head_dim": 64}  # width multiplier 4, heads fixed at 2
MUP = {"model.parametrization": "mup", "model.base_d_model": 32, "model.base_head_dim": 16}


def our_params(config) -> dict[str, np.ndarray]:
    """Torch-style name -> array of the model's parameters at init."""
    _, state = run_setup.init_state(config)
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state["params"]):
        name = jax.tree_util.keystr(path).removesuffix(".value")
        out[name.replace("']['", ".").replace("'][", ".").replace("]['", ".").strip("[]'")] = (
            np.asarray(leaf))
    return out


def torch_model(d_model: int, head_dim: int, heads: int = 2, seq: int = 1024, vocab: int = 256):
    """Our LM's parameters under our names, in PyTorch, the readout mup's MuSharedReadout."""
    torch = require("torch")
    mup = require("mup")
    nn = torch.nn
    inner = heads * head_dim

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.mlp_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.attention = nn.Module()
            for name, (fan_in, fan_out) in {"query": (d_model, inner), "key": (d_model, inner),
                                            "value": (d_model, inner),
                                            "out": (inner, d_model)}.items():
                setattr(self.attention, name, nn.Linear(fan_in, fan_out, bias=False))
            self.mlp_in = nn.Linear(d_model, 4 * d_model)
            self.mlp_out = nn.Linear(4 * d_model, d_model)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.position_embed = nn.Embedding(seq, d_model)
            self.blocks = nn.ModuleList([Block()])
            self.final_norm = nn.LayerNorm(d_model)
            self.readout = mup.MuSharedReadout(self.embed.weight, bias=False)

    return LM()


def sp_std_at_base(name: str, shape) -> float:
    """SP's init std of a parameter of the *base* model (initializers.py; nnx.Embed's default
    N(0, 1/d) for the token embedding; position embeddings N(0, 0.02²); zero biases, unit
    LayerNorm gains, which mup.init leaves to the caller)."""
    if name.endswith("kernel"):
        return 1 / math.sqrt(shape[0])
    if name == "embed.embedding":
        return 1 / math.sqrt(BASE["model.d_model"])
    if name == "position_embed.embedding":
        return 0.02
    return 0.0


def torch_name(name: str) -> str:
    return (name.replace("embedding", "weight").replace("kernel", "weight")
            .replace("norm.scale", "norm.weight"))


@pytest.fixture(scope="module")
def mup_torch():
    """The wide torch model with base shapes from the base one, μP-initialised by mup.init from
    the base model's SP stds, and MuAdamW's parameter groups."""
    torch = require("torch")
    mup = require("mup")
    torch.manual_seed(0)
    model = torch_model(WIDE["model.d_model"], WIDE["model.head_dim"])
    base = torch_model(BASE["model.d_model"], BASE["model.head_dim"])
    mup.set_base_shapes(model, base, rescale_params=False)
    ours = our_params(tiny_config(**{**WIDE, **MUP}))
    names = dict(model.named_parameters())
    for name in ours:
        base_shape = names[torch_name(name)].infshape.base_shape()
        std = sp_std_at_base(name, base_shape[::-1] if name.endswith("kernel") else base_shape)
        with torch.no_grad():
            if std:
                mup.init.normal_(names[torch_name(name)], std=std)
            else:
                names[torch_name(name)].fill_(1.0 if name.endswith("scale") else 0.0)
    groups = mup.MuAdamW(model.parameters(), lr=1.0, weight_decay=0.1).param_groups
    by_param = {id(p): (g["lr"], g["lr"] * g["weight_decay"]) for g in groups for p in g["params"]}
    return model, ours, {name: by_param[id(p)] for name, p in names.items()}


def test_init_std_matches_mup(mup_torch):
    model, ours, _ = mup_torch
    torch_params = dict(model.named_parameters())
    for name, value in ours.items():
        theirs = torch_params[torch_name(name)].detach().numpy()
        assert theirs.size == value.size, name
        if value.size >= 1000:  # a std estimated from >= 1000 draws: within 8%
            assert np.std(value) == pytest.approx(np.std(theirs), rel=0.08), name
        else:
            np.testing.assert_allclose(value, theirs.reshape(value.shape), err_msg=name)


def measured_multipliers(config) -> dict[str, tuple[float, float]]:
    """Per parameter (Adam-step multiplier, decay multiplier) of our μP optimiser, measured as
    its update over the SP optimiser's on the same gradient (then on zero gradients, where
    the update is the decay alone)."""
    multipliers = optim.OptimizerSettings.of(config).param_lr_multipliers
    _, state = run_setup.init_state(config)
    params = state["params"]
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape), params)
    ratios = []
    for g, decay in ((grads, 0.0), (jax.tree.map(jnp.zeros_like, grads), 0.1)):
        sp = optim.OptimizerSettings(steps=10, warmup_steps=0, grad_clip=0.0, weight_decay=decay)
        mup = optim.OptimizerSettings(10, 0, 0.0, decay, param_lr_multipliers=multipliers)
        updates = [tx.update(g, tx.init(params), params)[0] for tx in
                   (optim.make_optimizer(mup), optim.make_optimizer(sp))]
        ratios.append(jax.tree.map(lambda a, b: float(jnp.sum(a * b) / jnp.sum(b * b))
                                   if float(jnp.sum(b * b)) else 1.0, *updates))
    names = our_params(config).keys()
    adam, decay = (jax.tree_util.tree_leaves(r) for r in ratios)
    return dict(zip(names, zip(adam, decay, strict=True), strict=True))


def test_lr_multipliers_match_mu_adamw(mup_torch):
    """MuAdamW: a matrix-like group's lr / width_mult and weight_decay · width_mult; ours: the
    Adam step × the same, the decoupled decay lr·wd·p unchanged."""
    _, _, groups = mup_torch
    measured = measured_multipliers(tiny_config(**{**WIDE, **MUP}))
    for name, (adam, decay) in measured.items():
        lr, lr_times_wd = groups[torch_name(name)]
        assert adam == pytest.approx(lr, rel=1e-5), name
        assert decay == pytest.approx(lr_times_wd / 0.1, rel=1e-5), name
    assert {round(a, 6) for a, _ in measured.values()} == {0.25, 1.0}  # the wide model: m = 4


def test_readout_matches_mu_shared_readout(mup_torch):
    torch = require("torch")
    model, ours, _ = mup_torch
    config = tiny_config(**{**WIDE, **MUP})
    graphdef, state = run_setup.init_state(config)
    from flax import nnx
    lm = nnx.merge(graphdef, state["params"], state["rest"])
    x = np.random.default_rng(0).normal(size=(2, 3, WIDE["model.d_model"])).astype(np.float32)
    with torch.no_grad():
        model.embed.weight.copy_(torch.from_numpy(np.array(ours["embed.embedding"])))
        theirs = model.readout(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(lm.readout_logits(jnp.asarray(x))), theirs,
                               rtol=1e-5, atol=1e-6)


def test_mup_at_its_base_width_is_sp_bit_for_bit():
    """mup's multipliers are all 1 at the base shape: two train steps give the same state."""
    final = []
    for extra in ({}, MUP):
        config = tiny_config(**{**BASE, **extra, "policy": "mup_inv_dk:16"})
        graphdef, state = run_setup.init_state(config)
        step = jax.jit(steps.make_train_step(graphdef, optim.make_optimizer(config), 0.0))
        batch = {"inputs": jnp.arange(64).reshape(2, 32) % 256,
                 "targets": (jnp.arange(64).reshape(2, 32) + 1) % 256,
                 "weights": jnp.ones((2, 32))}
        for _ in range(2):
            state, _ = step(state, batch, None)
        final.append(jax.tree_util.tree_leaves(state["params"]))
    for a, b in zip(*final, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sp_adds_no_optimiser_step():
    assert optim.OptimizerSettings.of(tiny_config(**WIDE)).param_lr_multipliers == ()


@pytest.mark.parametrize("head_dim", [16, 64, 256])
def test_mup_inv_dk_is_mups_attn_mult_over_d(head_dim):
    """mup's README: attention 8/d (attn_mult 8 at d = 64); mup_inv_dk:B is √B/d, so 1/√B at
    d = B."""
    assert policies.get("mup_inv_dk").base_scale(head_dim) == pytest.approx(8 / head_dim)
    assert policies.get(f"mup_inv_dk:{head_dim}").base_scale(head_dim) == pytest.approx(
        1 / math.sqrt(head_dim))


def test_zero_init_readout_starts_at_uniform_logits():
    config = tiny_config(**{**WIDE, **MUP, "model.readout_zero_init": True})
    model = build_model(run_config.validate(config), __import__("flax").nnx.Rngs(params=0))
    logits, _ = model(jnp.zeros((1, 8), jnp.int32))
    np.testing.assert_array_equal(np.asarray(logits), 0.0)


@pytest.mark.parametrize("overrides, field", [
    ({"model.parametrization": "mu"}, "model.parametrization"),
    ({**MUP, "model.init": "gpt2"}, "model.parametrization=mup needs model.init=fan_in"),
    ({"model.base_d_model": -1}, "model.base_d_model"),
])
def test_bad_parametrization_fields_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        run_config.validate(tiny_config(**overrides))


# --- every refusal of model/parametrization.py -----------------------------------------------
# `check` is reached through `ModelConfig.check`; from a run config the schema (and the config's
# own typing) refuses most of these first (the test above), so a ModelConfig built directly, as
# a program may, is where parametrization.py's own refusals speak.

def model_config(**fields) -> ModelConfig:
    return ModelConfig(d_model=32, num_layers=1, num_heads=2, head_dim=16,
                       layer_policies=("inv_sqrt_dk",), **fields)


@pytest.mark.parametrize("fields, field, value", [
    ({"parametrization": "mu"}, "model.parametrization", "'mu'"),
    ({"parametrization": "SP"}, "model.parametrization", "'SP'"),
    ({"base_d_model": -1}, "model.base_d_model", "-1"),
    ({"base_d_model": True}, "model.base_d_model", "True"),  # a bool is no width
    ({"base_head_dim": 8.0}, "model.base_head_dim", "8.0"),
    ({"base_head_dim": "16"}, "model.base_head_dim", "'16'"),
    ({"readout_zero_init": 1}, "model.readout_zero_init", "1"),
    ({"readout_zero_init": "yes"}, "model.readout_zero_init", "'yes'"),
    ({"parametrization": "mup", "init": "xavier"}, "model.parametrization=mup needs "
     "model.init=fan_in", "'xavier'"),
    ({"parametrization": "mup", "init": "gpt2"}, "model.parametrization=mup needs "
     "model.init=fan_in", "'gpt2'"),
])
def test_each_parametrization_refusal_is_one_line_naming_the_field_and_value(fields, field,
                                                                             value):
    with pytest.raises(ConfigError) as raised:
        model_config(**fields).check()
    message = str(raised.value)
    assert message.startswith(field) and message.endswith(value) and "\n" not in message


@pytest.mark.parametrize("fields", [
    {}, {"parametrization": "mup"}, {"base_d_model": 0, "base_head_dim": 0},
    {"parametrization": "mup", "base_d_model": 8, "base_head_dim": 4, "readout_zero_init": True},
    {"init": "gpt2"},  # sp takes any init
])
def test_the_edges_of_the_refusals_are_accepted(fields):
    assert model_config(**fields).check() is None


@pytest.mark.parametrize("shape, base, says", [
    ((32, 64), (32,), "another rank"),
    ((32,), (32, 64), "another rank"),
    ((4, 8, 16), (2, 4, 8), "more than two dims"),  # three dims differ: no mup class
])
def test_a_parameter_outside_mups_classes_is_refused_by_every_rule(shape, base, says):
    for rule in (parametrization.role, parametrization.lr_multiplier,
                 parametrization.init_multiplier):
        with pytest.raises(ValueError, match=says):
            rule(shape, base)


@pytest.mark.parametrize("shape, base, expected", [
    ((4, 8, 16), (4, 8, 16), "finite"), ((4, 8, 16), (2, 8, 16), "vector"),
    ((4, 8, 16), (2, 4, 16), "matrix"), ((64, 32), (16, 32), "output"),
    ((64,), (16,), "vector"),  # a 1-D parameter's one dim is no fan-in of a kernel
])
def test_role_counts_the_dims_that_differ(shape, base, expected):
    assert parametrization.role(shape, base) == expected


@pytest.mark.parametrize("spec", ["mup_inv_dk:0", "mup_inv_dk:-16", "mup_inv_dk:x",
                                  "mup_inv_dk:inf"])
def test_mup_inv_dk_refuses_a_base_head_dim_that_is_not_positive(spec):
    with pytest.raises(ValueError, match=r"^policy 'mup_inv_dk' got .*a base head dim B$"):
        policies.get(spec)
