"""The monitoring bands' claims (`analysis.monitoring_bands`) on synthetic studies written as
summary.csv files, whose best runs are placed by hand inside or outside the article's bands."""

from __future__ import annotations

import os

import pytest

from scale_ablation.analysis import monitoring_bands
from scale_ablation.records.summary_csv import write_summary_csv


def row(bpb: float, entropy: float, max_weight: float, *, logit_std: float | None = None,
        status: str = "completed", failures: str = "", policy: str = "inv_sqrt_dk") -> dict:
    out = {"name": f"{policy},{bpb}", "policy": policy, "d_k": 32, "lr": 3e-3, "seed": 0,
           "task": "lm", "status": status, "final_val_bpb": bpb, "failures": failures,
           "final_entropy_normalised": entropy, "final_max_weight": max_weight}
    if logit_std is not None:
        out["final_logit_std"] = logit_std
    return out


def write_study(results, name: str, rows: list[dict]) -> None:
    folder = results / name
    folder.mkdir(parents=True)
    write_summary_csv(rows, str(folder / "summary.csv"))


def test_the_best_run_is_the_smooth_one_of_lowest_validation_bpb(tmp_path):
    rows = [row(2.9, 0.9, 0.3), row(2.5, 0.5, 0.8, failures="spiked"),  # better, not smooth
            row(2.4, 0.4, 0.9, status="diverged"), row(2.7, 0.85, 0.4, policy="inv_dk")]
    assert monitoring_bands.best_run(rows)["policy"] == "inv_dk"
    write_study(tmp_path, "study", rows)
    [found] = monitoring_bands.load_standings(str(tmp_path))
    assert found.values["normalised entropy"] == pytest.approx(0.85)
    assert found.share_inside["normalised entropy"] == (2, 2)  # 0.9 and 0.85 of the smooth two


def test_older_csvs_without_the_taxonomy_use_the_step_columns():
    spiked = {**row(2.0, 0.1, 0.9), "spike_step": 300}
    del spiked["failures"]
    clean = {**row(2.6, 0.9, 0.3), "spike_step": None}
    del clean["failures"]
    assert monitoring_bands.best_run([spiked, clean]) is clean


def test_mqar_studies_choose_by_accuracy():
    rows = [{**row(0.0, 0.9, 0.2), "task": "mqar", "final_val/accuracy": 0.6},
            {**row(0.0, 0.3, 0.9), "task": "mqar", "final_val/accuracy": 0.99}]
    assert monitoring_bands.best_run(rows)["final_val/accuracy"] == 0.99


@pytest.mark.parametrize(("entropies", "verdict"), [
    ((0.9, 0.85, 0.95), "supported"),      # every best run inside
    ((0.5, 0.6, 0.95), "contradicted"),    # two of three outside: most
    ((0.5, 0.85, 0.95), "inconclusive"),   # one of three outside
])
def test_a_band_verdict_counts_the_studies_best_runs(tmp_path, entropies, verdict):
    for i, entropy in enumerate(entropies):
        write_study(tmp_path, f"s{i}", [row(2.5, entropy, 0.3), row(3.0, 0.99, 0.1)])
    standings = monitoring_bands.load_standings(str(tmp_path))
    entropy_band = monitoring_bands.BANDS[0]
    assert monitoring_bands.judge_band(entropy_band, standings).verdict == verdict
    max_weight_band = monitoring_bands.BANDS[1]
    assert monitoring_bands.judge_band(max_weight_band, standings).verdict == "supported"  # 0.3<0.7


def test_a_missing_logit_std_is_said_and_inconclusive(tmp_path):
    write_study(tmp_path, "old", [row(2.5, 0.9, 0.3)])
    write_study(tmp_path, "new", [row(2.5, 0.9, 0.3, logit_std=1.5)])
    standings = monitoring_bands.load_standings(str(tmp_path))
    verdict = monitoring_bands.judge_band(monitoring_bands.BANDS[2], standings)
    assert verdict.verdict == "contradicted"  # the one study with a value: 1.5 > 1.2
    assert any("no final_logit_std in: old" in n for n in verdict.numbers)
    write_study(tmp_path / "none", "old", [row(2.5, 0.9, 0.3)])
    lonely = monitoring_bands.load_standings(str(tmp_path / "none"))
    assert monitoring_bands.judge_band(monitoring_bands.BANDS[2], lonely).verdict == "inconclusive"


def test_band_edges_follow_the_article():
    entropy, weight, std = monitoring_bands.BANDS
    assert entropy.inside(0.81) and not entropy.inside(0.8)
    assert weight.inside(0.69) and not weight.inside(0.7)
    assert std.inside(1.0) and not std.inside(0.79) and not std.inside(1.21)


def test_the_markdown_table_has_a_row_per_study_and_a_verdict_per_band(tmp_path):
    write_study(tmp_path, "alpha", [row(2.5, 0.6, 0.3)])
    write_study(tmp_path, "beta", [row(2.4, 0.9, 0.75)])
    path = monitoring_bands.write_markdown(str(tmp_path))
    assert path == os.path.join(str(tmp_path), monitoring_bands.OUT_NAME)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert "| alpha | inv_sqrt_dk, d_k 32, lr 0.003 | final_val_bpb 2.500 | 0.600 ✗ | 0.300 |" in text
    assert "| beta |" in text and "0.750 ✗" in text
    assert text.count("- **Healthy runs sit at") == 3
    lines = monitoring_bands.verdict_lines(str(tmp_path))
    assert len(lines) == 3 and lines[0].startswith("Healthy runs sit at normalised entropy > 0.8")


def test_the_command_refuses_a_missing_folder(tmp_path, capsys):
    assert monitoring_bands.main(["bands", str(tmp_path / "nope")]) == 2
    assert "usage" in capsys.readouterr().err


def test_a_study_without_a_smooth_run_has_no_standing_and_the_command_writes_the_rest(
        tmp_path, capsys):
    unfinished = [row(2.4, 0.9, 0.3, status="diverged"), row(2.5, 0.9, 0.3, failures="spiked")]
    assert monitoring_bands.best_run(unfinished) is None
    assert monitoring_bands.standing("rough", unfinished) is None
    write_study(tmp_path, "rough", unfinished)
    write_study(tmp_path, "smooth", [row(2.6, 0.9, 0.3)])
    assert [s.study for s in monitoring_bands.load_standings(str(tmp_path))] == ["smooth"]
    assert monitoring_bands.main(["bands", str(tmp_path)]) == 0
    written = (tmp_path / monitoring_bands.OUT_NAME).read_text(encoding="utf-8")
    assert capsys.readouterr().out.strip() == os.path.join(str(tmp_path), monitoring_bands.OUT_NAME)
    assert "| smooth |" in written and "| rough |" not in written
