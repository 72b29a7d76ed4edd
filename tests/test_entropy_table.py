"""The entropy table (experiments/entropy_table.py), a no-training probe: its `quick` variant
runs in-process, and what it writes is checked against an independent numpy reference and the
law it measures (article claims 1 and 2). `load_quick`, `run_quick` and `header` serve the
other probe's tests too (tests/test_variance_probe.py)."""

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
