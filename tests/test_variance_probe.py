"""The variance probe (experiments/variance_probe.py), a no-training probe: its `quick` variant
runs in-process, and what it writes is checked against the laws it measures (article claim 5):
Var(q·k) from the measured variances, the post-scale logit std as each policy's scale (written
out by hand) times the measured std, and init gain 2 as 16 × Var(q·k)."""

import math

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
