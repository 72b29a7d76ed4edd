"""Every experiment file in experiments/, default, `quick` and `cpu` variants, resolves to valid runs.

Files are globbed, so a new experiment is covered without touching this file. A training
experiment's grid must apply cleanly (no unknown field), give unique run names, and resolve to
configs that `config.validate` accepts with policy specs the registry knows. Probes (files that
define `run(config, workdir)`) train nothing and have no grid to check.
"""

from __future__ import annotations

import os
import pathlib

import ml_collections
import pytest
from flax import nnx

from scale_ablation.analysis import claims
from scale_ablation.model import policies
from scale_ablation.model.build import build_model
from scale_ablation.training import ensemble, provenance
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training.run_config import layer_policy_specs, validate

REPO = pathlib.Path(__file__).resolve().parents[1]
EXPERIMENT_FILES = sorted(p for p in (REPO / "experiments").glob("*.py") if p.name != "__init__.py")
VARIANTS = (None, "quick")
CPU_STUDIES = ("base", "dk_sweep", "lr_sensitivity", "length_generalization", "init_gain",
               "norm_placement", "stability", "learned_scale", "precision", "mqar",
               "dk_exponent", "explode_or_oscillate", "precision_dk",
               "stability_dropout")  # 2 cores

# The article's alternatives against 1/√d_k: the default's policies (issue 31) and the quick
# smoke test's (issue 56), written out here rather than imported.
DK_SWEEP_POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1")


def spec_of(path: pathlib.Path, variant: str | None) -> str:
    return str(path) if variant is None else f"{path}:{variant}"


def get(config: ml_collections.ConfigDict, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


CASES = [
    pytest.param(path, variant, id=f"{path.stem}:{variant or 'default'}")
    for path in EXPERIMENT_FILES
    for variant in (*VARIANTS, *(("cpu",) if path.stem in CPU_STUDIES else ()))
]


def test_the_glob_finds_the_experiments():
    names = {p.stem for p in EXPERIMENT_FILES}
    assert {"base", "dk_sweep", "lr_sensitivity", "learned_scale", "init_gain"} <= names
    assert {"norm_placement", "precision", "stability", "mqar"} <= names


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_get_config_builds_a_config_dict(path, variant):
    config = experiment.load_config(spec_of(path, variant))
    assert isinstance(config, ml_collections.ConfigDict)
    assert config.to_dict(), f"{path.name}: empty config"


@pytest.mark.parametrize("path", [pytest.param(path, id=path.stem) for path in EXPERIMENT_FILES])
def test_an_unknown_variant_is_refused(path):
    # A typo ("quik") must not silently launch the full-size sweep; main and sweep print a
    # ValueError from get_config as one line.
    with pytest.raises(ValueError, match="quik"):
        experiment.load_config(f"{path}:quik")


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_grid_resolves_to_valid_runs(path, variant):
    spec = spec_of(path, variant)
    module, arg = experiment.load_module(spec)
    if experiment.is_probe(module):
        pytest.skip(f"{path.name} is a probe (run(config, workdir)): no grid")
    base = module.get_config(arg)
    grid = list(module.sweep(arg)) if hasattr(module, "sweep") else [{}]
    assert grid, f"{spec}: empty grid"

    names = []
    for overrides in grid:
        config = experiment.apply_overrides(base, overrides)  # raises on an unknown field
        for key, value in overrides.items():
            assert get(config, key) == value, f"{spec}: override {key}={value!r} not applied"
        validate(config)
        specs = layer_policy_specs(config)
        assert len(specs) == config.model.num_layers
        for policy_spec in specs:
            policies.get(policy_spec)
        names.append(experiment.run_name(overrides))
    # The base config itself is not touched by applying a point.
    assert base.to_dict() == module.get_config(arg).to_dict()

    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"{spec}: run names shared by several points: {duplicates}"
    for name in names:
        assert name and os.sep not in name and name not in (".", ".."), f"bad run dir {name!r}"


def dk_sweep_points(variant: str | None) -> list[ml_collections.ConfigDict]:
    spec = spec_of(REPO / "experiments" / "dk_sweep.py", variant)
    base = experiment.load_config(spec)
    return [experiment.apply_overrides(base, overrides)
            for overrides in experiment.load_grid(spec)]


@pytest.mark.parametrize("variant", ["quick"])  # cpu and the default: d_k by q/k width, below
def test_dk_sweep_has_a_fixed_width_and_a_fixed_heads_arm(variant):
    configs = dk_sweep_points(variant)
    d_model = {c.model.d_model for c in configs}
    assert len(d_model) == 1, "d_model is what the fixed-width arm holds: one value per variant"
    d_model = d_model.pop()
    heads_of_base = experiment.load_config(
        spec_of(REPO / "experiments" / "dk_sweep.py", variant)).model.num_heads
    cells = {(c.model.num_heads, c.model.head_dim) for c in configs}
    fixed_width = {d for h, d in cells if h * d == d_model}
    fixed_heads = {d for h, d in cells if h == heads_of_base}
    assert len(fixed_width) >= 2 and len(fixed_heads) >= 2, cells
    assert all(h * d == d_model or h == heads_of_base for h, d in cells), cells
    assert max(fixed_heads) > d_model, "the fixed-heads arm reaches d_k beyond the width"
    # Every policy (and init) at every cell.
    keys = [(c.policy, c.model.num_heads, c.model.head_dim, c.model.init) for c in configs]
    expected = {(policy, *cell, init) for policy in {c.policy for c in configs}
                for cell in cells for init in {c.model.init for c in configs}}
    assert set(keys) == expected
    # Each policy the same number of times at every cell (its own LR grid × seeds).
    for policy in {c.policy for c in configs}:
        assert len({keys.count(k) for k in expected if k[0] == policy}) == 1, policy


def test_quick_and_default_dk_sweeps_cover_every_policy_and_both_inits():
    quick = dk_sweep_points("quick")
    assert {c.policy for c in quick} == set(DK_SWEEP_POLICIES)
    assert {c.model.init for c in quick} == {"fan_in", "gpt2"}
    # The default (issue 31): the article's alternatives against 1/√d_k, both inits, d_k as the
    # q/k width at one width and head count.
    default = dk_sweep_points(None)
    assert {c.policy for c in default} == set(DK_SWEEP_POLICIES)
    assert {c.model.init for c in default} == {"fan_in", "gpt2"}
    assert {(c.model.d_model, c.model.num_heads, c.model.head_dim) for c in default} == {
        (512, 8, 64)}
    assert {c.model.qk_dim for c in default} == {16, 64, 256, 512}


def test_quick_dk_sweep_compiles_once_per_shape(tmp_path):
    """The smoke test's runs train as one ensemble per shape (cell × init), each compiling its
    programs once (issue 56: 32 shapes for 64 runs spent 67% of it compiling), every policy at
    each LR of one grid, and its largest d_k is one the claims call large."""
    quick = dk_sweep_points("quick")
    shapes = {(c.model.num_heads, c.model.head_dim, c.model.init) for c in quick}
    groups = ensemble.group(quick, [tmp_path / str(index) for index in range(len(quick))])
    assert len(groups) == len(shapes) == 6
    lrs = {c.train.lr for c in quick}
    assert len(lrs) >= 3
    assert sorted(len(g) for g in groups) == [len(DK_SWEEP_POLICIES) * len(lrs)] * len(shapes)
    assert {(c.policy, c.train.lr) for c in quick} == {
        (p, lr) for p in DK_SWEEP_POLICIES for lr in lrs}
    assert max(c.model.head_dim for c in quick) == 256


def test_cpu_dk_sweep_has_a_fixed_width_arm_and_a_qk_width_arm():
    """cpu: num_heads × d_k = d_model cells (fan_in), and d_k as the q/k width of one fixed
    (heads, value width) cell under both inits; every policy at every cell equally often."""
    configs = dk_sweep_points("cpu")
    d_model = {c.model.d_model for c in configs}.pop()
    fixed_width = [c for c in configs if not c.model.qk_dim]
    qk_arm = [c for c in configs if c.model.qk_dim]
    assert {c.model.num_heads * c.model.head_dim for c in fixed_width} == {d_model}
    assert len({c.model.head_dim for c in fixed_width}) >= 2
    assert {c.model.init for c in fixed_width} == {"fan_in"}
    assert len({(c.model.num_heads, c.model.head_dim) for c in qk_arm}) == 1
    assert len({c.model.qk_dim for c in qk_arm}) >= 2 and {c.model.init for c in qk_arm} == {
        "fan_in", "gpt2"}
    cells = [(c.model.head_dim, c.model.qk_dim, c.model.init) for c in configs]
    for policy in {c.policy for c in configs}:
        mine = [cell for c, cell in zip(configs, cells, strict=True) if c.policy == policy]
        assert {mine.count(cell) for cell in set(cells)} == {len(mine) // len(set(cells))}


def test_fixed_width_holds_the_parameter_count_and_qk_width_moves_only_the_qk_projections():
    """Counted from built models: the fixed-width arm's cells have equal parameter counts (the
    point of the control); the q/k arm's differ by exactly the q and k projections' growth,
    layers × 2 × d_model × heads × Δqk_dim (weights and biases counted another way)."""
    counts = {}
    for c in dk_sweep_points("cpu"):
        cell = (c.model.init, c.model.num_heads, c.model.head_dim, c.model.qk_dim)
        if cell not in counts:
            model = build_model(validate(c), nnx.Rngs(0))
            counts[cell] = provenance.parameter_counts(nnx.state(model, nnx.Param))["parameters"]
            d_model, layers = c.model.d_model, c.model.num_layers
    assert len({n for (_, _, _, qk), n in counts.items() if not qk}) == 1, counts
    for init, bias in (("fan_in", 0), ("gpt2", 1)):  # gpt2's projections carry biases
        (_, heads, value, small), (*_, large) = sorted(k for k in counts if k[3] and k[0] == init)
        growth = counts[(init, heads, value, large)] - counts[(init, heads, value, small)]
        assert growth == layers * 2 * heads * (d_model + bias) * (large - small), counts


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model.no_such_field", 1),
        ("no_such_group.lr", 1),
        ("train.lr.deeper", 1),  # below a leaf value
        ("policy.inv", 1),  # "inv" is a substring of the policy string, not a field
        ("train.lr", "fast"),  # a field keeps its type
    ],
)
def test_a_bad_override_is_a_value_error(key, value):
    # The grid check above, and the sweep's one-line exit 2, rely on this being a ValueError.
    config = experiment.load_config(str(REPO / "experiments" / "base.py"))
    with pytest.raises(ValueError, match="override"):
        experiment.apply_overrides(config, {key: value})


@pytest.mark.parametrize("path", EXPERIMENT_FILES, ids=lambda p: p.stem)
def test_claims_name_policies_the_grid_runs(path):
    """A claim about a policy the experiment never runs could only ever be inconclusive."""
    for variant in (None, "quick", *(("cpu",) if path.stem in CPU_STUDIES else ())):
        module, arg = experiment.load_module(f"{path}:{variant}" if variant else str(path))
        if not hasattr(module, "claims"):
            continue
        declared = module.claims(arg)
        assert declared and all(isinstance(c, claims.Claim) for c in declared)
        grid_policies = {point.get("policy") for point in module.sweep(arg)}
        for claim in declared:
            policies_of = getattr(claim.rule, "policies", None)
            if policies_of is None:  # a Transfer names (parametrisation, policy) settings
                policies_of = [policy for _, policy in claim.rule.settings]
            named = set(policies_of) | ({getattr(claim.rule, "reference", None)} - {None})
            assert named <= grid_policies, (claim.text, named - grid_policies)


def test_a_widened_grid_is_the_base_grid_plus_its_additions_in_order():
    from experiments import base

    widened = {"edge": (3e-4, 3e-2), ("tuple", 16): (1e-1,)}
    assert base.lr_grid_for("edge", (1e-3, 1e-2), widened) == (3e-4, 1e-3, 1e-2, 3e-2)
    assert base.lr_grid_for(("tuple", 16), (1e-2, 1e-3), widened) == (1e-3, 1e-2, 1e-1)
    assert base.lr_grid_for("other", (1e-2, 1e-3), widened) == (1e-3, 1e-2)
    assert base.lr_grid_for("edge", (3e-4, 1e-3), widened) == (3e-4, 1e-3, 3e-2)  # once each
