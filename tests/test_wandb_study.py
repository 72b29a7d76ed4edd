"""A published study loaded into W&B offline: read back with the offline reader
(`records.wandb_offline`), each run's history equals its store's metrics rows, its summary the
store's summary, its group the study and its tags its policy and d_k."""

from __future__ import annotations

import math

import pytest
from helpers import REPO, snapshot

from scale_ablation import wandb_study
from scale_ablation.records import study_store, wandb_offline

HEADLINE = REPO / "experiments" / "results" / "scale_one_fan_in"


def same_value(a, b) -> bool:
    """W&B keeps a float 2.0 as 2 and a dict nested; NaN equals NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) in (type(b), int, float) and type(b) in (type(a), int, float)


def test_a_published_study_reads_back_from_w_and_b_as_its_store(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "wandb_headline"
    runs = study_store.read_store(str(HEADLINE / study_store.STORE_FILE)).runs
    assert wandb_study.load(str(HEADLINE), str(out), mode="offline") == [r.name for r in runs]
    for run in runs:
        (folder,) = wandb_offline.find_run_dirs(out / run.name)
        history = wandb_offline.read_history(folder)
        assert [row["_step"] for row in history] == [row["step"] for row in run.metrics]
        for logged, row in zip(history, run.metrics, strict=True):
            logged = {k: v for k, v in logged.items() if not k.startswith("_")}
            assert same_value(logged, {k: v for k, v in row.items() if k != "step"})
        summary = wandb_offline.read_summary(folder)
        for key, value in run.summary.items():
            if value is not None and key != "wandb_run_id":
                assert same_value(summary[key], value), key
        seen = wandb_offline.read_run(folder)
        assert (seen["name"], seen["group"], seen["job_type"]) == (run.name, "scale_one_fan_in",
                                                                   "published")
        assert f"policy={run.config['policy']}" in seen["tags"]
        assert f"d_k={run.config['model']['head_dim']}" in seen["tags"]
        assert same_value(seen["config"]["train"], run.config["train"])

    before = snapshot(out)  # loaded again: every run is there, nothing is written
    assert wandb_study.load(str(HEADLINE), str(out), mode="offline") == []
    assert snapshot(out) == before


@pytest.mark.parametrize("mode, says", [("offline", "holds no runs.parquet"),
                                        ("sometimes", "--mode must be one of")])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, mode, says):
    study = tmp_path / "study"
    study.mkdir()
    if mode != "offline":
        (study / study_store.STORE_FILE).write_bytes((HEADLINE / study_store.STORE_FILE)
                                                     .read_bytes())
    with pytest.raises(ValueError, match=says):
        wandb_study.load(str(study), str(tmp_path / "out"), mode=mode)
    assert not (tmp_path / "out").exists()
