"""Head-dim μP against the mup package, with the head dim as the only dimension that differs
between the base and the target model (d_model 32 and 2 heads in both): our LM in PyTorch with
mup's set_base_shapes, mup.init and MuAdamW, the attention's output projection a MuReadout (mup
asserts that a Linear of infinite fan-in and finite fan-out is one). Two arms: q/k/v per head
grown together (`model.head_dim`) and q/k alone (`model.qk_dim`).

We fold MuReadout's forward 1/m into the output projection's weight (parametrization.py), so a
torch weight W that acts × f (f: its MuReadout's output_mult / width_mult, 1 for a Linear) is
compared as the product: our init std is f · std(W), our Adam step multiplier f · its group's lr
(Adam's step does not follow the gradient's scale), our decoupled decay its lr · wd. Then one
MuAdamW step of the output projection against one of our optimiser's, as functions."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import require, tiny_config
from test_mup import measured_multipliers, our_params, sp_std_at_base, torch_name

from scale_ablation.model import base_shapes, parametrization
from scale_ablation.training import optim, run_config, run_setup

D_MODEL, HEADS, BASE_DIM, WIDE_DIM = 32, 2, 16, 64
MUP = {"model.parametrization": "mup", "model.base_d_model": D_MODEL,
       "model.base_head_dim": BASE_DIM}
OUT_KERNEL = "['blocks'][0]['attention']['out']['kernel'].value"
ARMS = {  # arm -> (our config at the wide head dim, torch (head_dim, qk_dim) of base and target)
    "head_dim": ({"model.head_dim": WIDE_DIM}, (BASE_DIM, BASE_DIM), (WIDE_DIM, WIDE_DIM)),
    "qk_dim": ({"model.head_dim": BASE_DIM, "model.qk_dim": WIDE_DIM}, (BASE_DIM, BASE_DIM),
               (BASE_DIM, WIDE_DIM)),
}


def torch_model(head_dim: int, qk_dim: int, seq: int = 1024, vocab: int = 256):
    """Our one-layer LM under our names in PyTorch at d_model 32: the output projection mup's
    MuReadout, the tied readout MuSharedReadout."""
    torch = require("torch")
    mup = require("mup")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.mlp_norm = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
            self.attention = nn.Module()
            self.attention.query = nn.Linear(D_MODEL, HEADS * qk_dim, bias=False)
            self.attention.key = nn.Linear(D_MODEL, HEADS * qk_dim, bias=False)
            self.attention.value = nn.Linear(D_MODEL, HEADS * head_dim, bias=False)
            self.attention.out = mup.MuReadout(HEADS * head_dim, D_MODEL, bias=False)
            self.mlp_in = nn.Linear(D_MODEL, 4 * D_MODEL)
            self.mlp_out = nn.Linear(4 * D_MODEL, D_MODEL)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, D_MODEL)
            self.position_embed = nn.Embedding(seq, D_MODEL)
            self.blocks = nn.ModuleList([Block()])
            self.final_norm = nn.LayerNorm(D_MODEL)
            self.readout = mup.MuSharedReadout(self.embed.weight, bias=False)

    return LM()


def forward_multipliers(model) -> dict[str, float]:
    """torch parameter name -> what its module multiplies it by in the forward pass (a
    MuReadout's output_mult / width_mult; 1 for anything else)."""
    mup = require("mup")
    out = {}
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(prefix=module_name, recurse=False):
            out[name] = (module.output_mult / module.width_mult()
                         if isinstance(module, mup.MuReadout) else 1.0)
    return out


@functools.cache
def mup_arm(arm_name: str):
    """(arm, our μP config, the mup model initialised from the base model's SP stds,
    {torch name: (lr, lr · wd) of its MuAdamW group}, {torch name: forward multiplier})."""
    torch = require("torch")
    mup = require("mup")
    ours_config, base_dims, wide_dims = ARMS[arm_name]
    config = tiny_config(**{**MUP, **ours_config})
    torch.manual_seed(0)
    model, base = torch_model(*wide_dims), torch_model(*base_dims)
    mup.set_base_shapes(model, base, rescale_params=False)  # asserts out is a MuReadout
    names = dict(model.named_parameters())
    for name in our_params(config):
        # mup's base_shape() has None for a finite dim: the base model's is the target's.
        base_shape = [d.base_dim or d.dim for d in names[torch_name(name)].infshape]
        std = sp_std_at_base(name, base_shape[::-1] if name.endswith("kernel") else base_shape)
        with torch.no_grad():
            if std:
                mup.init.normal_(names[torch_name(name)], std=std)
            else:
                names[torch_name(name)].fill_(1.0 if name.endswith("scale") else 0.0)
    groups = mup.MuAdamW(model.parameters(), lr=1.0, weight_decay=0.1).param_groups
    by_param = {id(p): (g["lr"], g["lr"] * g["weight_decay"]) for g in groups for p in g["params"]}
    return (arm_name, config, model, {name: by_param[id(p)] for name, p in names.items()},
            forward_multipliers(model))


@pytest.fixture(scope="module", params=sorted(ARMS))
def arm(request):
    return mup_arm(request.param)


def test_only_the_head_dim_differs(arm):
    """The comparison is along the head dim alone: mup sees no other infinite dimension."""
    name, _, model, _, _ = arm
    infinite = {n: [d.dim for d in p.infshape if d.isinf()] for n, p in model.named_parameters()}
    grown = {n for n, dims in infinite.items() if dims}
    inner = HEADS * WIDE_DIM
    assert all(dims == [inner] for dims in infinite.values() if dims)
    expected = {"attention.query", "attention.key"} | (
        {"attention.value", "attention.out"} if name == "head_dim" else set())
    assert grown == {f"blocks.0.{e}.weight" for e in expected}


def test_init_std_matches_mup(arm):
    _, config, model, _, multipliers = arm
    torch_params = dict(model.named_parameters())
    for name, value in our_params(config).items():
        theirs = torch_params[torch_name(name)].detach().numpy()
        effective = theirs * multipliers[torch_name(name)]
        assert effective.size == value.size, name
        if value.size >= 1000:  # a std estimated from >= 1000 draws: within 8%
            assert np.std(value) == pytest.approx(np.std(effective), rel=0.08), name
        else:
            np.testing.assert_allclose(value, effective.reshape(value.shape), err_msg=name)


def test_lr_multipliers_match_mu_adamw(arm):
    name, config, _, groups, multipliers = arm
    measured = measured_multipliers(config)
    for param, (adam, decay) in measured.items():
        lr, lr_times_wd = groups[torch_name(param)]
        assert adam == pytest.approx(lr * multipliers[torch_name(param)], rel=1e-5), param
        assert decay == pytest.approx(lr_times_wd / 0.1, rel=1e-5), param
    # Not vacuous: growing v and the output projection ×4 moves the latter's step by 1/4;
    # growing q/k alone moves nothing (mup's groups are all lr 1 there too).
    expected = {0.25, 1.0} if name == "head_dim" else {1.0}
    assert {round(a, 6) for a, _ in measured.values()} == expected


def our_step(config, kernel: np.ndarray, grad: np.ndarray, lr: float) -> np.ndarray:
    """Our output kernel after one step of our μP optimiser (decay 0.1) from `kernel`, on
    gradient `grad` there and zero elsewhere."""
    def at_out(value, otherwise):
        return lambda path, leaf: (jnp.asarray(value) if jax.tree_util.keystr(path) == OUT_KERNEL
                                   else otherwise(leaf))

    _, state = run_setup.init_state(config)
    params = jax.tree_util.tree_map_with_path(at_out(kernel, lambda leaf: leaf), state["params"])
    grads = jax.tree_util.tree_map_with_path(at_out(grad, jnp.zeros_like), params)
    settings = optim.OptimizerSettings(
        10, 0, 0.0, 0.1,
        param_lr_multipliers=optim.OptimizerSettings.of(config).param_lr_multipliers)
    tx = optim.make_optimizer(settings)
    updates = tx.update(grads, tx.init(params), params)[0]
    found = {jax.tree_util.keystr(p): (leaf, u) for (p, leaf), u in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(updates),
        strict=True)}
    leaf, update = found[OUT_KERNEL]
    return np.asarray(leaf + lr * update)


def test_one_mu_adamw_step_of_the_output_projection():
    """From the same function, one MuAdamW step of mup's MuReadout and one step of our μP
    optimiser on our output kernel, each on the gradient of Σ C ⊙ out(x), give the same
    function again (up to Adam's ε); and the step is large enough to be seen."""
    torch = require("torch")
    mup = require("mup")
    _, config, model, _, _ = mup_arm("head_dim")  # under qk_dim it keeps its width
    rng = np.random.default_rng(0)
    lr = 1e-2
    x, cotangent = (rng.normal(size=(64, n)).astype(np.float32)
                    for n in (HEADS * WIDE_DIM, D_MODEL))
    out = model.blocks[0].attention.out
    effective = out.weight.detach().numpy().T * (out.output_mult / out.width_mult())
    before = out(torch.from_numpy(x)).detach().numpy()
    adam = mup.MuAdamW(out.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    (out(torch.from_numpy(x)) * torch.from_numpy(cotangent)).sum().backward()
    adam.step()
    theirs = out(torch.from_numpy(x)).detach().numpy()
    ours = our_step(config, effective, x.T @ cotangent, lr)
    np.testing.assert_allclose(x @ effective, before, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x @ ours, theirs, rtol=1e-4, atol=1e-4)
    assert np.abs(theirs - before).mean() > 100 * 1e-4  # the step dwarfs the tolerance


def test_the_readout_is_not_folded_twice():
    """The readout is a MuReadout of its own (lm.py multiplies its input by 1/m_d), so its
    weight keeps the base LR and init, as mup's MuAdamW gives an untied MuReadout: widths 32 →
    128 with `model.readout_zero_init`."""
    mup = require("mup")
    wide, base = (mup.MuReadout(d, 256, bias=False, readout_zero_init=True) for d in (128, 32))
    mup.set_base_shapes(wide, base, rescale_params=False)
    (group,) = mup.MuAdamW(wide.parameters(), lr=1.0).param_groups
    config = run_config.model_config(tiny_config(
        **{"model.d_model": 128, "model.head_dim": 64, "model.readout_zero_init": True,
           "model.parametrization": "mup", "model.base_d_model": 32, "model.base_head_dim": 16}))
    readout = [dict(found).get(f"{base_shapes.READOUT}.value", 1.0) for found in
               (base_shapes.lr_multipliers(config), base_shapes.init_multipliers(config))]
    assert readout == [group["lr"], 1.0]
    assert wide.width_mult() == pytest.approx(1 / parametrization.readout_multiplier(config))


def test_sp_takes_no_multiplier_from_base_shape_fields():
    """The base shape speaks under μP only: the same wide model under sp keeps every parameter's
    own LR and init (SP's definition), though its base fields name a narrower model."""
    fields = {**ARMS["head_dim"][0], **MUP}
    sp = run_config.model_config(tiny_config(**{**fields, "model.parametrization": "sp"}))
    mup = run_config.model_config(tiny_config(**fields))
    assert base_shapes.lr_multipliers(sp) == () == base_shapes.init_multipliers(sp)
    assert dict(base_shapes.lr_multipliers(mup))[OUT_KERNEL] == BASE_DIM / WIDE_DIM  # μP's do
