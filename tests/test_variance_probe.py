"""The variance probe (experiments/variance_probe.py), a no-training probe: its `quick` variant
runs in-process, and what it writes is checked against the laws it measures (article claim 5):
Var(q·k) from the measured variances, the post-scale logit std as each policy's scale (written
out by hand) times the measured std, init gain 2 as 16 × Var(q·k), and the init axis: the q, k
variances each init's std gives unit-variance inputs (fan_in: gain², gpt2: d_model·(0.02·gain)²),
and the law's rule recounted from the CSV."""

import math
import re

import pytest
from test_entropy_table import header, load_quick, run_quick

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
    table = {(r["policy"], r["init"], int(r["d_k"]), float(r["init_gain"])): r for r in rows}
    return workdir, config, table


def value(row: dict, field: str) -> float:
    return float(row[field])


def test_variance_probe_writes_its_files(probe):
    workdir, config, table = probe
    assert header(workdir / "variance_probe.csv") == [
        "policy",
        "init",
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
        len(probe_config.policies) * len(probe_config.inits) * len(probe_config.head_dims)
        * len(probe_config.init_gains)
    )
    assert "Var(q·k)" in (workdir / "variance_probe.md").read_text()
    assert (workdir / "variance_probe.png").read_bytes()[:4] == b"\x89PNG"
    assert {r["qk_measured_on"] for (p, *_), r in table.items() if p == "qk_layernorm"} == {
        "policy.transform_qk"
    }


def test_var_qk_follows_the_law_with_measured_variances(probe):
    _, _, table = probe
    for (policy, init, d, gain), row in table.items():
        if policy in NON_NORM:
            law = d * value(row, "var_q") * value(row, "var_k")
            assert value(row, "var_qk_measured") / law == pytest.approx(1, abs=0.15), (
                policy,
                init,
                d,
                gain,
            )


def test_post_scale_logit_std_is_the_scale_times_the_measured_std(probe):
    _, _, table = probe
    low, high = 0.8, 1.2  # the article's §5.2 band
    for (policy, _, d, gain), row in table.items():
        std = value(row, "logit_std_after_scale")
        if policy in SCALES:
            expected = math.sqrt(value(row, "var_qk_measured")) * SCALES[policy](d)
            assert std == pytest.approx(expected, rel=0.03), (policy, d, gain)
        else:  # logit_layernorm: rows of unit std over the keys, then 1/√d_k (pitfall 2)
            assert std == pytest.approx(1 / math.sqrt(d), rel=0.05), (policy, d, gain)
        if row["in_health_band"] == "True":  # every head in band, so their RMS is too
            assert low <= std <= high


def test_init_gain_two_multiplies_var_qk_by_sixteen(probe):
    _, _, table = probe
    for policy, init, d, _ in table:
        ratio = value(table[(policy, init, d, 2.0)], "var_qk_measured") / value(
            table[(policy, init, d, 1.0)], "var_qk_measured"
        )
        # g⁴ for raw projections; QK-norm divides the gain out again.
        expected = 1.0 if policy == "qk_layernorm" else 2.0**4
        assert ratio == pytest.approx(expected, rel=0.15), (policy, init, d)


def test_each_init_sets_the_qk_variances(probe):
    """The attention norm's output has unit variance at init, so q = h·W has variance
    fan_in·σ_W²: gain² under fan_in (σ_W = gain/√fan_in), d_model·(0.02·gain)² under gpt2."""
    _, config, table = probe
    assert set(config.probe.inits) == {"fan_in", "gpt2"}
    assert {init for _, init, _, _ in table} == set(config.probe.inits)
    d_model = config.model.d_model
    for (policy, init, d, gain), row in table.items():
        if policy not in NON_NORM:
            continue
        expected = gain**2 if init == "fan_in" else d_model * (0.02 * gain) ** 2
        for field in ("var_q", "var_k"):
            assert value(row, field) == pytest.approx(expected, rel=0.1), (policy, init, d, gain)


def test_the_law_verdict_is_the_csv_recounted(probe):
    """The rule (measured / law within [0.81, 1.21]) over the CSV's rows gives the .md's verdict
    and range; the distinct measurements are the (init, d_k, gain, Var(q·k)) the CSV holds."""
    workdir, _, table = probe
    ratios = {(init, d, g, row["var_qk_measured"]): value(row, "ratio")
              for (_, init, d, g), row in table.items()}
    inside = sum(0.81 <= r <= 1.21 for r in ratios.values())
    text = (workdir / "variance_probe.md").read_text()
    found = re.search(r"the law (holds|fails)\*\*: (\d+) of (\d+) cells within the band; "
                      r"measured / law from (\d+\.\d+) to (\d+\.\d+)", text)
    assert found, text
    verdict, n_in, n_all, low, high = found.groups()
    assert (int(n_in), int(n_all)) == (inside, len(ratios))
    assert verdict == ("holds" if inside == len(ratios) else "fails")
    assert float(low) == pytest.approx(min(ratios.values()), abs=1e-3)
    assert float(high) == pytest.approx(max(ratios.values()), abs=1e-3)


def test_the_law_verdict_names_a_cell_outside_the_band():
    module, config = load_quick("variance_probe")
    probe = config.probe
    probe.policies, probe.inits, probe.head_dims, probe.init_gains = ("none",), ("gpt2",), (16,), (1.0,)
    row = {"var_qk_measured": 1.0, "ratio": 1.3}
    lines = module.law_verdict({("none", "gpt2", 16, 1.0): row}, probe)
    assert "**Result: the law fails**: 0 of 1 cells" in "\n".join(lines)
    assert lines[-1] == "- outside: none (gpt2, d_k 16, gain 1): 1.300"


def test_variance_probe_rejects_a_bad_head_dim(tmp_path):
    module, config = load_quick("variance_probe")
    config.probe.head_dims = (1, 16)
    with pytest.raises(ValueError, match="head_dims"):
        module.run(config, str(tmp_path))
