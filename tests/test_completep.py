"""CompleteP (`model.depth_alpha`, model/depth.py) against two references written here, not
imported: Table 1 of Dey et al. 2025 ("Don't be lazy: CompleteP enables compute-efficient deep
transformers", its α column), and the formulas of EleutherAI/nanoGPT-mup's completep branch
(commit 6f8bc3b) as read there. Every multiplier is measured on the built model and optimiser:
the residual branches' as the block's output with one branch zeroed against the same weights
without depth_alpha, the learning rate, the decay and Adam's ε as the optimiser's updates against
plain AdamW's. Plus: off (absent, 0, None) and at the base depth, training is bit-identical to
the model without the fields; bad values are one ConfigError line naming the field."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from scale_ablation.errors import ConfigError
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import optim, run_config, run_setup, steps

EPS_BASE = 1e-8  # optim.py's Adam ε; the measurement below finds it again at the base
WIDE = {"model.parametrization": "mup", "model.d_model": 64, "model.head_dim": 32,
        "model.base_d_model": 32, "model.base_head_dim": 16}  # μP width multiplier m_N = 2
# (L, L_base, α, extra overrides, m_N): deeper and shallower than the base, α at both ends and
# inside, and one case with μP's width multiplier.
CASES = [(4, 2, 0.5, {}, 1.0), (8, 2, 1.0, {}, 1.0), (2, 4, 0.5, {}, 1.0),
         (6, 3, 0.75, {}, 1.0), (4, 2, 0.5, WIDE, 2.0)]


def depth_config(layers, base, alpha, extra=None):
    return tiny_config(**{"model.num_layers": layers, "model.base_num_layers": base,
                          "model.depth_alpha": alpha, **(extra or {})})


def group(path: str) -> str:
    """The table's parameter group of one of our parameters (keystr path)."""
    if path.startswith(("['embed']", "['position_embed']")):
        return "embed"
    if path.startswith("['final_norm']"):
        return "final_ln"
    if "_norm']" in path:
        return "pre_ln"
    if path.endswith("['kernel'].value"):
        return "hidden_weight"
    if path.endswith("['bias'].value"):
        return "hidden_bias"
    raise AssertionError(f"a parameter the table does not name: {path}")


# ------------------------------------------------------------------------------- references

def paper_table(m_L: float, alpha: float, m_N: float) -> dict:
    """Dey et al. 2025, Table 1, column α ∈ [0.5, 1], as multipliers of the base model's values
    (σ²_base, η_base, λ_base, ε_base): Embed LR η; Pre-LN LR η·m_L^(α-1); Hidden LR
    η·m_N^-1·m_L^(α-1); Hidden Bias LR η·m_L^(α-1); Hidden WD λ·m_N; residuals
    X + m_L^-α·MHA(LN(X)), Z + m_L^-α·MLP(LN(Z)); Final-LN LR η; AdamW ε (residual blocks)
    ε·m_N^-1·m_L^-α. AdamW decays by LR × WD a step, so the hidden weights' decay is their LR ×
    m_N; the embeddings' is η·λ."""
    lr = {"embed": 1.0, "pre_ln": m_L ** (alpha - 1), "hidden_weight": m_N ** -1 * m_L ** (alpha - 1),
          "hidden_bias": m_L ** (alpha - 1), "final_ln": 1.0}
    residual_blocks = ("pre_ln", "hidden_weight", "hidden_bias")
    return {"residual": m_L ** -alpha, "lr": lr,
            "decay": {"embed": 1.0, "hidden_weight": lr["hidden_weight"] * m_N},
            "eps": {g: m_N ** -1 * m_L ** -alpha if g in residual_blocks else 1.0 for g in lr}}


def nanogpt_mup_completep(depth_multiplier: float, depth_alpha_exp: float,
                          mup_width_multiplier: float) -> dict:
    """EleutherAI/nanoGPT-mup, branch completep (6f8bc3b), as multipliers of the base values.
    model.py:113  residual_scaling = 1/(depth_multiplier ** depth_alpha_exp), applied at 117-118
    to both branches; model.py:331-332  depth_lr_scaling = depth_multiplier ** (α - 1),
    width_lr_scaling = 1/mup_width_multiplier; model.py:335  adam_eps *= (1/mup_width_multiplier)
    · depth_multiplier ** (-α), one ε for every group; model.py:336-357 the groups' (lr_scale,
    weight_decay): embeddings (1, wd), hidden LN (depth, 0), hidden weights (width · depth,
    wd / width), hidden biases (depth, 0), final LN (1, 0); train.py:299 a group's lr is
    lr · lr_scale, and torch's AdamW decays by lr · weight_decay a step."""
    depth_lr_scaling = depth_multiplier ** (depth_alpha_exp - 1)
    width_lr_scaling = 1 / mup_width_multiplier
    eps = (1 / mup_width_multiplier) * depth_multiplier ** (-1 * depth_alpha_exp)
    groups = {"embed": (1.0, 1.0), "pre_ln": (depth_lr_scaling, 0.0),
              "hidden_weight": (width_lr_scaling * depth_lr_scaling, 1 / width_lr_scaling),
              "hidden_bias": (depth_lr_scaling, 0.0), "final_ln": (1.0, 0.0)}
    return {"residual": 1 / (depth_multiplier ** depth_alpha_exp),
            "lr": {g: lr for g, (lr, _) in groups.items()},
            "decay": {g: lr * wd for g, (lr, wd) in groups.items() if wd},
            "eps": dict.fromkeys(groups, eps)}


# ------------------------------------------------------------------------------ measurements

def updates(settings, params, grads):
    tx = optim.make_optimizer(settings)
    found = tx.update(grads, tx.init(params), params)[0]
    return {jax.tree_util.keystr(p): np.asarray(u, np.float64)
            for p, u in jax.tree_util.tree_leaves_with_path(found)}


def measured_optimiser(config) -> dict[str, dict[str, float]]:
    """Per parameter path: the update multiplier ("lr", on N(0, 1) gradients without decay), the
    decay multiplier ("decay", zero gradients, decay 0.1; decayed parameters only), both against
    plain AdamW's, and Adam's ε over ε_base ("eps": gradients of ε_base everywhere, whose first
    Adam step is g/(g + ε), divided by the update multiplier)."""
    settings = dataclasses.replace(optim.OptimizerSettings.of(config), steps=10, warmup_steps=0,
                                   grad_clip=0.0, weight_decay=0.0)
    plain = optim.OptimizerSettings(steps=10, warmup_steps=0, grad_clip=0.0, weight_decay=0.0)
    params = run_setup.init_state(config)[1]["params"]
    normal = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape), params)
    zeros, tiny = (jax.tree.map(lambda p, v=v: jnp.full(p.shape, v), params)
                   for v in (0.0, EPS_BASE))
    ours, base = updates(settings, params, normal), updates(plain, params, normal)
    decayed = [updates(dataclasses.replace(s, weight_decay=0.1), params, zeros)
               for s in (settings, plain)]
    first = updates(settings, params, tiny)
    out = {}
    for path, base_update in base.items():
        lr = float(np.sum(ours[path] * base_update) / np.sum(base_update ** 2))
        step = float(np.mean(-first[path])) / lr  # g/(g + ε) with g = ε_base
        out[path] = {"lr": lr, "eps": (1 / step - 1)}
        if np.any(decayed[1][path]):
            out[path]["decay"] = float(np.mean(decayed[0][path] / decayed[1][path]))
    return out


def zeroed_branch_delta(config, initial: tuple, zero: str) -> np.ndarray:
    """Each block's output minus its input on a fixed x, with the branch `zero` ("mlp" or
    "attention") zeroed: the other branch as it joins the stream. `initial`: the config's
    (graphdef, state), not changed (merged from a copy: nnx.merge shares the state's
    variables, which the zeroing writes)."""
    graphdef, state = initial
    copy = jax.tree.map(lambda x: x, state)
    lm = nnx.merge(graphdef, copy["params"], copy["rest"])
    x = jax.random.normal(jax.random.key(2), (2, 8, config.model.d_model))
    deltas = []
    for block in lm.blocks:
        layer = block.mlp_out if zero == "mlp" else block.attention.out
        biases = [layer.bias] if getattr(layer, "bias", None) is not None else []
        for param in (layer.kernel, *biases):
            param[...] = jnp.zeros_like(param[...])
        deltas.append(np.asarray(block(x)[0] - x, np.float64))
    return np.stack(deltas)


def measured_residual(config) -> list[float]:
    """Per branch and block: its contribution to the stream over the same weights' without
    depth_alpha (the init does not depend on it: checked)."""
    off = experiment.apply_overrides(config, {"model.depth_alpha": 0.0})
    on_init, off_init = run_setup.init_state(config), run_setup.init_state(off)
    for a, b in zip(jax.tree.leaves(on_init[1]["params"]), jax.tree.leaves(off_init[1]["params"]),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # init × 1
    ratios = []
    for zero in ("mlp", "attention"):
        on = zeroed_branch_delta(config, on_init, zero)
        plain = zeroed_branch_delta(off, off_init, zero)
        ratios += [float(np.sum(a * b) / np.sum(b * b)) for a, b in zip(on, plain, strict=True)]
    return ratios


# ----------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"L{c[0]}-base{c[1]}-a{c[2]}-mN{c[4]:g}")
def case(request):
    layers, base, alpha, extra, m_N = request.param
    config = depth_config(layers, base, alpha, extra)
    return (layers / base, alpha, m_N, measured_optimiser(config), measured_residual(config))


def check_against(reference: dict, optimiser: dict, residual: list[float],
                  eps_groups: tuple[str, ...]) -> None:
    np.testing.assert_allclose(residual, reference["residual"], rtol=1e-5)
    for path, found in optimiser.items():
        g = group(path)
        assert found["lr"] == pytest.approx(reference["lr"][g], rel=1e-5), path
        assert ("decay" in found) == (g in reference["decay"]), path
        if "decay" in found:
            assert found["decay"] == pytest.approx(reference["decay"][g], rel=1e-5), path
        if g in eps_groups:
            assert found["eps"] == pytest.approx(reference["eps"][g], rel=1e-3), path


def test_the_multipliers_are_the_papers_table(case):
    m_L, alpha, m_N, optimiser, residual = case
    check_against(paper_table(m_L, alpha, m_N), optimiser, residual,
                  ("embed", "pre_ln", "hidden_weight", "hidden_bias", "final_ln"))


def test_the_multipliers_are_nanogpt_mups_completep_formulas(case):
    """The same, against the branch; one difference, stated: the branch scales one optimiser-
    wide ε (model.py:335), the table and we only the residual blocks', so the embeddings' and
    the final norm's ε are ε_base here and scaled there."""
    m_L, alpha, m_N, optimiser, residual = case
    branch = nanogpt_mup_completep(m_L, alpha, m_N)
    check_against(branch, optimiser, residual, ("pre_ln", "hidden_weight", "hidden_bias"))
    outside = [found["eps"] for path, found in optimiser.items()
               if group(path) in ("embed", "final_ln")]
    assert outside and outside == pytest.approx([1.0] * len(outside), rel=1e-3)
    assert branch["eps"]["embed"] == pytest.approx(m_N ** -1 * m_L ** -alpha)


def test_the_cases_move_every_multiplier():
    """Not vacuous: across the cases each multiplier the table defines is somewhere not 1."""
    tables = [paper_table(L / base, alpha, m_N) for L, base, alpha, _, m_N in CASES]
    assert all(t["residual"] != 1 for t in tables)
    for g in ("pre_ln", "hidden_weight", "hidden_bias"):
        assert any(t["lr"][g] != 1 for t in tables) and any(t["eps"][g] != 1 for t in tables), g
    assert any(t["decay"]["hidden_weight"] != 1 for t in tables)


def trained(config, num_steps: int = 3) -> tuple[list[np.ndarray], object]:
    graphdef, state = run_setup.init_state(config)
    tx = optim.make_optimizer(config)
    step = jax.jit(steps.make_train_step(graphdef, tx, 0.0))
    tokens = jnp.arange(64).reshape(2, 32) % 256
    batch = {"inputs": tokens, "targets": (tokens + 1) % 256, "weights": jnp.ones((2, 32))}
    for _ in range(num_steps):
        state, _ = step(state, batch, None)
    return ([np.asarray(leaf) for leaf in jax.tree.leaves(state)],
            jax.tree.structure(tx.init(state["params"])))


def test_off_and_at_the_base_depth_training_is_bit_identical():
    """A config written before the fields existed, depth_alpha 0 (with any base), None, and
    CompleteP at its own base depth (every multiplier 1) train to the same bits with the same
    optimiser state; the settings of the off ones are the old config's."""
    old = tiny_config(**{"model.num_layers": 2})
    del old.model["depth_alpha"], old.model["base_num_layers"]
    variants = [tiny_config(**{"model.num_layers": 2, **extra}) for extra in (
        {}, {"model.depth_alpha": None}, {"model.depth_alpha": 0, "model.base_num_layers": 5},
        {"model.depth_alpha": 0.5, "model.base_num_layers": 2},
        {"model.depth_alpha": 1.0, "model.base_num_layers": 2})]
    reference, structure = trained(old)
    for config in variants:
        leaves, found = trained(config)
        assert found == structure, config.model
        for a, b in zip(leaves, reference, strict=True):
            np.testing.assert_array_equal(a, b)
    settings = optim.OptimizerSettings.of(old)
    assert all(optim.OptimizerSettings.of(c) == settings for c in variants[:3])
    # Not vacuous: one layer off the base and the bits differ.
    moved, _ = trained(tiny_config(**{"model.num_layers": 2, "model.depth_alpha": 0.5,
                                      "model.base_num_layers": 1}))
    assert any(not np.array_equal(a, b) for a, b in zip(moved, reference, strict=True))


@pytest.mark.parametrize("overrides, says", [
    ({"model.depth_alpha": 0.3, "model.base_num_layers": 1}, "model.depth_alpha"),
    ({"model.depth_alpha": 1.5, "model.base_num_layers": 1}, "model.depth_alpha"),
    ({"model.depth_alpha": -1.0, "model.base_num_layers": 1}, "model.depth_alpha"),
    ({"model.depth_alpha": 0.5, "model.base_num_layers": 0}, "model.base_num_layers"),
    ({"model.base_num_layers": 0}, "model.base_num_layers"),
    ({"model.depth_alpha": 0.5, "model.base_num_layers": -2}, "model.base_num_layers"),
    ({"model.depth_alpha": 0.5, "model.base_num_layers": 1, "model.norm_position": "post"},
     "norm_position=pre"),
    ({"model.depth_alpha": 0.5, "model.base_num_layers": 1, "model.init": "gpt2"}, "gpt2"),
])
def test_a_bad_value_is_one_line_naming_the_field(overrides, says):
    with pytest.raises(ConfigError) as error:
        run_config.validate(tiny_config(**overrides))
    assert says in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("alpha", [0.5, 0.75, 1.0])
def test_alpha_in_range_with_a_base_depth_is_valid(alpha):
    model = run_config.validate(depth_config(3, 1, alpha))
    assert (model.depth_alpha, model.base_num_layers) == (alpha, 1)
