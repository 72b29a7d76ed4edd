"""The logit std's drift over training (scale_ablation/analysis/logit_drift.py), recomputed from
the same study store by independent code: pyarrow's rows, pandas and scipy's t quantile, not the
module's reader or `intervals`. Both the module's cells and the published table
(experiments/results/variance_probe/logit_drift.md) must be what this recomputation gives."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import REPO, require

from scale_ablation.analysis import logit_drift

STORE = REPO / "experiments" / "results" / "dk_exponent_cpu" / "runs.parquet"
PUBLISHED = REPO / "experiments" / "results" / "variance_probe" / "logit_drift.md"
LAYER_STD = re.compile(r"attn/layer\d+/logit_std")
scipy_stats = require("scipy.stats")


def run_frame() -> pd.DataFrame:
    """One row per (1/√d_k run, step with logit stds): init, d_k, lr, seed, bpb, step, std."""
    table = pq.read_table(STORE, columns=["config", "summary", "metrics"]).to_pylist()
    records = []
    for row in table:
        config, summary = json.loads(row["config"]), json.loads(row["summary"])
        if config["policy"] != "inv_sqrt_dk":
            continue
        metrics = pd.DataFrame(row["metrics"])
        columns = [c for c in metrics.columns if LAYER_STD.fullmatch(c)]
        logged = metrics.dropna(subset=columns, how="all")
        for step, std in zip(logged["step"], logged[columns].mean(axis=1), strict=True):
            records.append({"init": config["model"]["init"], "d_k": config["model"]["qk_dim"],
                            "d_model": config["model"]["d_model"], "lr": config["train"]["lr"],
                            "seed": config["train"]["seed"], "bpb": summary["final_val_bpb"],
                            "step": int(step), "std": std})
    return pd.DataFrame(records)


def t_interval(values: np.ndarray) -> tuple[float, float]:
    half = scipy_stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return values.mean(), half


@pytest.fixture(scope="module")
def expected() -> dict[tuple[str, int], dict]:
    frame = run_frame()
    runs = frame.drop_duplicates(["init", "d_k", "lr", "seed"])
    mean_bpb = runs.groupby(["init", "d_k", "lr"])["bpb"].mean().reset_index()
    out = {}
    for (init, d_k), group in mean_bpb.groupby(["init", "d_k"]):
        lr = group.loc[group["bpb"].idxmin(), "lr"]
        chosen = frame[(frame["init"] == init) & (frame["d_k"] == d_k) & (frame["lr"] == lr)]
        by_step = chosen.pivot(index="seed", columns="step", values="std")  # seeds × steps
        first, last = by_step.columns.min(), by_step.columns.max()
        law = 1.0 if init == "fan_in" else chosen["d_model"].iloc[0] * 0.02**2
        out[init, int(d_k)] = {
            "lr": lr, "edge": lr in (group["lr"].min(), group["lr"].max()), "law": law,
            "n": len(by_step), "steps": [int(s) for s in by_step.columns],
            "stds": {int(s): t_interval(by_step[s].to_numpy()) for s in by_step.columns},
            "ratio": t_interval((by_step[last] / by_step[first]).to_numpy()),
        }
    return out


def test_the_grid_is_what_the_study_ran(expected):
    assert sorted({init for init, _ in expected}) == ["fan_in", "gpt2"]
    assert sorted({d for _, d in expected}) == [8, 16, 32, 64, 128, 256]
    for cell in expected.values():
        assert cell["steps"] == [0, 200, 400] and cell["n"] == 3


def test_the_module_gives_the_same_cells(expected):
    cells = logit_drift.drift(str(STORE))
    assert [(c.init, c.d_k) for c in cells] == sorted(expected)
    for c in cells:
        want = expected[c.init, c.d_k]
        assert (c.lr, c.lr_on_edge, c.ratio.n) == (want["lr"], want["edge"], want["n"])
        assert c.law == pytest.approx(want["law"], rel=1e-12)
        assert list(c.stds) == want["steps"]
        for step, (mean, half) in want["stds"].items():
            assert (c.stds[step].mean, c.stds[step].half_width) == pytest.approx((mean, half),
                                                                                 rel=1e-9)
        assert (c.ratio.mean, c.ratio.half_width) == pytest.approx(want["ratio"], rel=1e-9)


def close_to(text: str, value: float) -> bool:
    """`text` is `value` rounded to the decimals `text` shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10**-decimals + 1e-12


def published_rows() -> list[list[str]]:
    lines = [line for line in PUBLISHED.read_text().splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_the_published_table_is_the_recomputation(expected):
    rows = published_rows()
    assert len(rows) == len(expected)
    for init, d_k, lr, n, law, *stds, ratio in rows:
        want = expected[init, int(d_k)]
        assert float(lr.split()[0]) == want["lr"] and ("(edge)" in lr) == want["edge"]
        assert int(n) == want["n"] and close_to(law, want["law"])
        for text, step in zip(stds, want["steps"], strict=True):
            mean, half = text.split(" ± ")
            assert close_to(mean, want["stds"][step][0]), (init, d_k, step, text)
            assert close_to(half, want["stds"][step][1]), (init, d_k, step, text)
        mean, half = ratio.split(" ± ")
        assert close_to(mean, want["ratio"][0]) and close_to(half, want["ratio"][1]), ratio


def test_the_published_findings_are_recounted(expected):
    text = PUBLISHED.read_text()
    at_law = sum(abs(c["stds"][0][0] / c["law"] - 1) <= 0.10 for c in expected.values())
    in_band = sum(0.8 <= c["stds"][c["steps"][-1]][0] <= 1.2 for c in expected.values())
    assert f"within ±10% of the law at init in {at_law} of {len(expected)} cells" in text
    assert f"inside the health band [0.8, 1.2] in {in_band} of {len(expected)} cells" in text


def test_the_module_writes_the_published_file(tmp_path, capsys):
    """The table and findings the module writes are the published file byte for byte, which
    the tests above check against the independent recomputation."""
    relative = str(STORE.relative_to(REPO))
    cells = logit_drift.drift(str(STORE))
    assert logit_drift.markdown(cells, relative) == PUBLISHED.read_text()
    written = logit_drift.write(str(STORE), str(tmp_path / "out"))
    assert [(c.init, c.d_k) for c in written] == [(c.init, c.d_k) for c in cells]
    text = (tmp_path / "out" / "logit_drift.md").read_text()
    assert text == logit_drift.markdown(cells, str(STORE)) and text in capsys.readouterr().out
    assert (tmp_path / "out" / "logit_drift.png").read_bytes()[:4] == b"\x89PNG"


def test_a_cell_of_one_seed_or_no_spread_is_written_as_it_is():
    one = logit_drift.Cell("fan_in", 8, 1e-3, True, 1.0,
                           {0: logit_drift.Estimate(1.0, None, 1),
                            400: logit_drift.Estimate(2.0, 0.0, 2)},
                           logit_drift.Estimate(2.0, 0.0, 2))
    table = [line for line in logit_drift.markdown([one], "x").splitlines()
             if line.startswith("| fan_in")]
    # No interval with one seed; "± 0" where the seeds agree exactly.
    assert table == ["| fan_in | 8 | 0.001 (edge) | 2 | 1 | 1 | 2 ± 0 | 2 ± 0 |"]


def test_the_law_at_init_per_init():
    # σ_q·σ_k = fan_in·σ_W² for unit-variance inputs: gain² under fan_in, d_model·(0.02·gain)²
    # under gpt2; xavier's σ_W depends on fan_out too: no law here.
    assert logit_drift.law_at_init({"init": "fan_in", "init_gain": 2.0}) == 4.0
    assert logit_drift.law_at_init({"init": "gpt2", "init_gain": 2.0, "d_model": 128}) == \
        pytest.approx(128 * 0.04**2)
    assert math.isnan(logit_drift.law_at_init({"init": "xavier", "init_gain": 1.0}))


def test_a_store_without_the_runs_or_their_step_0_is_refused(monkeypatch, tmp_path):
    def run(policy, steps):
        config = {"policy": policy, "model": {"init": "fan_in", "init_gain": 1.0, "head_dim": 8,
                                              "qk_dim": 0, "d_model": 32},
                  "train": {"lr": 1e-3, "seed": 0}}
        return SimpleNamespace(config=config, summary={"final_val_bpb": 3.0},
                               metrics=[{"step": s, "attn/layer0/logit_std": 1.0} for s in steps])

    stores = {"other": [run("inv_dk", (0, 200))], "late": [run("inv_sqrt_dk", (200, 400))]}
    monkeypatch.setattr(logit_drift, "read_store", lambda path: SimpleNamespace(runs=stores[path]))
    with pytest.raises(ValueError, match=r"^other holds no inv_sqrt_dk runs$"):
        logit_drift.write("other", str(tmp_path))
    with pytest.raises(ValueError, match=r"^late: fan_in d_k 8 has no logit std at step 0 in "
                                         r"every run$"):
        logit_drift.drift("late")
    assert not any(tmp_path.iterdir())  # nothing written
