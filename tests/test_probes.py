"""The no-training probes (experiments/entropy_table.py, experiments/variance_probe.py): their
`quick` variants run in-process, and what they write is checked against independent numpy
references and the laws they measure (article claims 1, 2 and 5)."""

import csv
import itertools
import math
import pathlib

import numpy as np
import pytest

from scale_ablation.training import experiment_files as experiment

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
REFERENCE_SAMPLES = 200_000


def load_quick(name: str):
    module, arg = experiment.load_module(f"{EXPERIMENTS / name}.py:quick")
    return module, module.get_config(arg)


def run_quick(name: str, workdir) -> tuple[object, list[dict]]:
    module, config = load_quick(name)
    module.run(config, str(workdir))
    with open(workdir / f"{name}.csv") as file:
        return config, list(csv.DictReader(file))


def header(path) -> list[str]:
    with open(path) as file:
        return next(csv.reader(file))


# --------------------------------------------------------------------------- entropy table


@pytest.fixture(scope="module")
def entropy(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("entropy_table")
    config, rows = run_quick("entropy_table", workdir)
    table = {(int(r["d_k"]), float(r["divisor"])): r for r in rows}
    return workdir, config, table


def reference(head_dim: int, divisor: float, n_keys: int = 3) -> dict[str, tuple[float, float]]:
    """Mean and per-sample std of entropy and max weight, by a different construction of the
    same law: given q, the q·k_j are i.i.d. N(0, |q|²), and |q|² ~ χ²(d_k)."""
    rng = np.random.default_rng(head_dim)
    norm = np.sqrt(rng.chisquare(head_dim, REFERENCE_SAMPLES))
    logits = norm[:, None] * rng.standard_normal((REFERENCE_SAMPLES, n_keys)) / divisor
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    entropy = -(probs * np.log(np.maximum(probs, 1e-30))).sum(1)
    max_weight = probs.max(1)
    return {
        "entropy": (entropy.mean(), entropy.std()),
        "max_weight": (max_weight.mean(), max_weight.std()),
    }


def test_entropy_table_writes_its_files(entropy):
    workdir, config, table = entropy
    assert header(workdir / "entropy_table.csv") == [
        "d_k",
        "divisor",
        "n_keys",
        "entropy",
        "max_weight",
    ]
    assert len(table) == len(config.head_dims) * len(config.divisors)
    text = (workdir / "entropy_table.md").read_text()
    assert f"ln(3) = {math.log(3):.4f}" in text and "**" in text  # uniform entropy, diagonal
    assert (workdir / "entropy_heatmap.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("cell", [(16, 4.0), (256, 1.0), (1024, 10.0), (64, 32.0)])
def test_entropy_cells_match_an_independent_monte_carlo(entropy, cell):
    _, config, table = entropy
    for field in ("entropy", "max_weight"):
        mean, std = reference(*cell)[field]
        se = std * math.sqrt(1 / config.n_samples + 1 / REFERENCE_SAMPLES)
        assert abs(float(table[cell][field]) - mean) < 5 * se, (cell, field)


def test_entropy_is_stable_under_sqrt_dk_and_collapses_without_divisor(entropy):
    _, config, table = entropy
    dims = sorted(config.head_dims)
    n = config.n_samples
    # Divisor 1: the logit std is √d_k, so the expected entropy falls strictly with d_k. Assert
    # the measured order only where the expected gap is over 6 standard errors at this n.
    for small, large in itertools.pairwise(dims):
        (mean_s, std_s), (mean_l, std_l) = (reference(d, 1.0)["entropy"] for d in (small, large))
        assert mean_s - mean_l > 6 * math.hypot(std_s, std_l) / math.sqrt(n)
        assert float(table[(small, 1.0)]["entropy"]) > float(table[(large, 1.0)]["entropy"])
    # Divisor √d_k: the law's own spread over d_k is small (|q|/√d_k concentrates at 1); the
    # measured one may exceed it by sampling noise only.
    diagonal = [reference(d, math.sqrt(d))["entropy"] for d in dims]
    law_spread = np.ptp([mean for mean, _ in diagonal])
    noise = 6 * math.sqrt(2) * max(std for _, std in diagonal) / math.sqrt(n)
    measured = [float(table[(d, math.sqrt(d))]["entropy"]) for d in dims]
    collapse = float(table[(dims[0], 1.0)]["entropy"]) - float(table[(dims[-1], 1.0)]["entropy"])
    assert np.ptp(measured) < law_spread + noise < collapse / 5


def test_entropy_table_rejects_a_bad_divisor(tmp_path):
    module, config = load_quick("entropy_table")
    config.divisors = ("1", "sqrt-4")
    with pytest.raises(ValueError, match="divisors"):
        module.run(config, str(tmp_path))


# --------------------------------------------------------------------------- variance probe

NON_NORM = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1", "gain_aware:2", "learned")
# The scale each policy applies at initialisation, written out by hand from its definition.
SCALES = {
    "inv_sqrt_dk": lambda d: 1 / math.sqrt(d),
    "none": lambda d: 1.0,
    "inv_dk": lambda d: 1 / d,
    "inv_log_dk": lambda d: 1 / math.log(d),
    "const:0.1": lambda d: 0.1,
    "gain_aware:2": lambda d: 1 / (4 * math.sqrt(d)),
    "learned": lambda d: 1 / math.sqrt(d),
    "qk_layernorm": lambda d: 1 / math.sqrt(d),
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("variance_probe")
    config, rows = run_quick("variance_probe", workdir)
    table = {(r["policy"], int(r["d_k"]), float(r["init_gain"])): r for r in rows}
    return workdir, config, table


def value(row: dict, field: str) -> float:
    return float(row[field])


def test_variance_probe_writes_its_files(probe):
    workdir, config, table = probe
    assert header(workdir / "variance_probe.csv") == [
        "policy",
        "d_k",
        "init_gain",
        "var_q",
        "var_k",
        "var_qk_measured",
        "var_qk_law",
        "ratio",
        "logit_std_after_scale",
        "in_health_band",
        "qk_measured_on",
    ]
    probe_config = config.probe
    assert len(table) == (
        len(probe_config.policies) * len(probe_config.head_dims) * len(probe_config.init_gains)
    )
    assert "Var(q·k)" in (workdir / "variance_probe.md").read_text()
    assert (workdir / "variance_probe.png").read_bytes()[:4] == b"\x89PNG"
    assert {r["qk_measured_on"] for (p, _, _), r in table.items() if p == "qk_layernorm"} == {
        "policy.transform_qk"
    }


def test_var_qk_follows_the_law_with_measured_variances(probe):
    _, _, table = probe
    for (policy, d, gain), row in table.items():
        if policy in NON_NORM:
            law = d * value(row, "var_q") * value(row, "var_k")
            assert value(row, "var_qk_measured") / law == pytest.approx(1, abs=0.15), (
                policy,
                d,
                gain,
            )


def test_post_scale_logit_std_is_the_scale_times_the_measured_std(probe):
    _, _, table = probe
    low, high = 0.8, 1.2  # the article's §5.2 band
    for (policy, d, gain), row in table.items():
        std = value(row, "logit_std_after_scale")
        if policy in SCALES:
            expected = math.sqrt(value(row, "var_qk_measured")) * SCALES[policy](d)
            assert std == pytest.approx(expected, rel=0.03), (policy, d, gain)
        else:  # logit_layernorm: rows of unit std over the keys, then 1/√d_k (pitfall 2)
            assert std == pytest.approx(1 / math.sqrt(d), rel=0.05), (policy, d, gain)
        if row["in_health_band"] == "True":  # every head in band, so their RMS is too
            assert low <= std <= high


def test_init_gain_two_multiplies_var_qk_by_sixteen(probe):
    _, config, table = probe
    for policy in config.probe.policies:
        for d in config.probe.head_dims:
            ratio = value(table[(policy, d, 2.0)], "var_qk_measured") / value(
                table[(policy, d, 1.0)], "var_qk_measured"
            )
            # g⁴ for raw projections; QK-norm divides the gain out again.
            expected = 1.0 if policy == "qk_layernorm" else 2.0**4
            assert ratio == pytest.approx(expected, rel=0.15), (policy, d)


def test_variance_probe_rejects_a_bad_head_dim(tmp_path):
    module, config = load_quick("variance_probe")
    config.probe.head_dims = (1, 16)
    with pytest.raises(ValueError, match="head_dims"):
        module.run(config, str(tmp_path))
