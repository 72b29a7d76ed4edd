"""experiments/learned_scale.py: the learned scale on gain-free QK-RMSNorm is what the study says
it is (the logits against s·⟨q̂, k̂⟩ in NumPy, and no q/k magnitude left to trade against s), it
has room to reach 1/√d_k (Adam moves log_scale by at most lr · scale_lr_multiplier ·
schedule(t) per step, summed from the optimiser's own schedule for every point of every
variant's grid), and its slope rule against scipy's regression on synthetic runs."""

from __future__ import annotations

import functools
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from experiments import learned_scale as study
from scale_ablation.model import attention, policies
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import optim

SPEC = str(pathlib.Path(__file__).resolve().parents[1] / "experiments" / "learned_scale.py")
BATCH, SEQ, HEADS, QK_DIM, V_DIM = 2, 6, 2, 16, 8


@functools.cache
def schedule_sum(settings: optim.OptimizerSettings) -> float:
    return float(optim.lr_multiplier(settings)(jnp.arange(settings.steps)).sum())


def room_and_need(variant: str | None, multiplier: float | None = None) -> list[tuple]:
    """(point, most log_scale can move, distance from its start to ln(1/√d_k))."""
    base = experiment.load_config(f"{SPEC}:{variant}" if variant else SPEC)
    out = []
    for point in experiment.load_grid(f"{SPEC}:{variant}" if variant else SPEC):
        config = experiment.apply_overrides(base, point)
        if "learned" not in config.policy:
            continue
        settings = optim.OptimizerSettings.of(config)
        total = schedule_sum(settings)
        m = settings.scale_lr_multiplier if multiplier is None else multiplier
        d_k = config.model.qk_dim or config.model.head_dim
        start = policies.get(config.policy).base_scale(d_k)
        out.append((point, config.train.lr * m * total, abs(math.log(start * math.sqrt(d_k)))))
    return out


@pytest.mark.parametrize("variant", [None, "quick", "cpu"])
def test_the_scale_can_reach_inv_sqrt_dk_from_every_start(variant):
    found = room_and_need(variant)
    assert found
    for point, room, need in found:
        assert room >= need, (point, room, need)


@pytest.mark.parametrize("variant", ["quick", "cpu"])
def test_at_the_models_own_lr_it_could_not(variant):
    """The multiplier is what makes the runs able to converge."""
    assert any(room < need for _, room, need in room_and_need(variant, multiplier=1.0))


# --------------------------------------------------------------------------- the composed policy


def qk(seed: int, scale: float) -> jax.Array:
    x = np.random.default_rng(seed).standard_normal((BATCH, SEQ, HEADS, QK_DIM))
    return jnp.asarray(scale * x, jnp.float32)


def with_scale(policy, s: float):
    """The policy's parameters with its one leaf, log s, set by hand."""
    params = policy.init(jax.random.key(0), num_heads=HEADS, head_dim=QK_DIM)
    leaves, treedef = jax.tree.flatten(params)
    assert len(leaves) == 1  # no gain: the learned scale is the only parameter
    return jax.tree.unflatten(treedef, [jnp.full_like(leaves[0], math.log(s))])


def logits_of(spec: str, params, q, k) -> np.ndarray:
    v = jnp.ones((BATCH, SEQ, HEADS, V_DIM), jnp.float32)
    _, internals = attention.attend(q, k, v, policy=policies.get(spec), params=params,
                                    return_internals=True)
    return np.asarray(internals.logits, np.float64)


@pytest.mark.parametrize("spec", [study.FROM_SQRT, study.FROM_ONE])
def test_the_logits_are_the_learned_scale_times_normalised_q_dot_k(spec):
    policy = policies.get(spec)
    q, k = qk(1, 3.0), qk(2, 0.2)
    params = with_scale(policy, 0.37)
    unit = lambda x: x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)  # noqa: E731
    expected = 0.37 * np.einsum("bqhd,bkhd->bhqk", unit(np.asarray(q, np.float64)),
                                unit(np.asarray(k, np.float64)))
    np.testing.assert_allclose(logits_of(spec, params, q, k), expected, rtol=1e-5, atol=1e-5)
    # Identifiable: no magnitude of q or k (W_Q, W_K) reaches the logits, only s does (while
    # mean(x²) stays far above the norm's eps, 1e-6).
    np.testing.assert_allclose(logits_of(spec, params, 5.0 * q, 3.0 * k), expected,
                               rtol=1e-4, atol=1e-5)


def test_each_start_is_its_own_and_the_diagnostics_log_s():
    """`+learned` starts at 1/√d_k, `+learned:1.0` at 1; the logged value is s itself."""
    for spec, start in ((study.FROM_SQRT, 1 / math.sqrt(QK_DIM)), (study.FROM_ONE, 1.0)):
        policy = policies.get(spec)
        params = policy.init(jax.random.key(0), num_heads=HEADS, head_dim=QK_DIM)
        assert policy.base_scale(QK_DIM) == pytest.approx(start)
        assert float(policy.learned_values(params)["scale"]) == pytest.approx(start, rel=1e-6)
        assert float(policy.learned_values(with_scale(policy, 0.2))["scale"]) == \
            pytest.approx(0.2, rel=1e-6)


# --------------------------------------------------------------------------- the slope's rule

D_KS, SEEDS, LRS = (8, 32, 128), (0, 1, 2), (3e-3, 1e-2, 3e-2)


def synthetic_rows(exponent: float, noise: float, best: dict | None = None) -> list[dict]:
    """Runs whose final scale is 0.8·d_k^exponent·e^(noise·z) at each d_k's best LR (the middle
    one unless `best` says otherwise), with a bits-per-byte curve whose minimum is there."""
    rng = np.random.default_rng(7)
    rows = []
    for d_k in D_KS:
        best_lr = (best or {}).get(d_k, LRS[1])
        for lr in LRS:
            for seed in SEEDS:
                value = 0.8 * d_k**exponent * math.exp(noise * rng.standard_normal())
                rows.append({"name": f"{d_k}-{lr}-{seed}", "policy": study.FROM_ONE,
                             "d_k": d_k, "lr": lr, "seed": seed, "status": "completed",
                             "override:model.qk_dim": d_k, "override:train.lr": lr,
                             "final_val_bpb": 2.5 + abs(math.log(lr / best_lr)),
                             "final_learned_scale": value})
    return rows


def test_the_slope_and_its_t_interval_are_scipys():
    rows = synthetic_rows(-0.5, 0.2)
    located, unsettled = study.scale_at_best_lr(rows, study.FROM_ONE)
    assert not unsettled and sorted(located) == list(D_KS)
    at_best = [r for r in rows if r["lr"] == LRS[1]]
    fit = scipy.stats.linregress([math.log(r["d_k"]) for r in at_best],
                                 [math.log(r["final_learned_scale"]) for r in at_best])
    # The t interval's spread and degrees of freedom are the d_k means' (one point per d_k).
    means = [np.mean([math.log(r["final_learned_scale"]) for r in at_best if r["d_k"] == d])
             for d in D_KS]
    on_means = scipy.stats.linregress(np.log(D_KS), means)
    slope, t_ci, boot_ci = study.slope_intervals(located)
    half = scipy.stats.t.ppf(0.975, len(D_KS) - 2) * on_means.stderr
    assert slope == pytest.approx(fit.slope) == pytest.approx(on_means.slope)
    assert t_ci == pytest.approx((fit.slope - half, fit.slope + half))
    assert boot_ci[0] < slope < boot_ci[1]


@pytest.mark.parametrize(("exponent", "verdict"), [
    (-0.5, "supported"), (-1.0, "contradicted"), (0.0, "contradicted")])
def test_the_rule_tells_the_exponents_apart(exponent, verdict):
    found = study.ScaleExponent(study.FROM_ONE).judge(synthetic_rows(exponent, 0.05))
    assert found.verdict == verdict, found


def test_a_best_lr_on_its_grids_edge_leaves_the_slope_inconclusive():
    rows = synthetic_rows(-0.5, 0.05, best={128: LRS[-1]})
    found = study.ScaleExponent(study.FROM_ONE).judge(rows)
    assert found.verdict == "inconclusive" and "edge" in " ".join(found.numbers)


def test_too_few_d_k_leave_it_inconclusive():
    rows = [r for r in synthetic_rows(-0.5, 0.05) if r["d_k"] != 32]
    assert study.ScaleExponent(study.FROM_ONE).judge(rows).verdict == "inconclusive"


@pytest.mark.parametrize(("spec", "says"), [
    ("learned+learned:1.0", "both policies compute the scale"),
    (f"{study.NORM}+inv_dk", "no logit transform or scale function"),
])
def test_a_second_scale_on_a_computed_one_or_a_plain_number_is_refused(spec, says):
    """B's own scale replaces only A's plain number; B's plain number would be ignored."""
    with pytest.raises(ValueError, match=says) as info:
        policies.get(spec)
    assert "\n" not in str(info.value) and spec in str(info.value)
