"""A published study regenerates from its own runs: experiments/results/STUDY/runs.parquet (the
study store, `records.study_store`) holds each run's config, summary and metrics rows and the
sweep's record; the report written from a copy of it gives the committed summary.csv and
claims.md, byte for byte."""

from __future__ import annotations

import pathlib
import shutil

import pytest
from helpers import REPO

from scale_ablation import report
from scale_ablation.records.study_store import STORE_FILE

RESULTS = REPO / "experiments" / "results"
STUDIES = sorted(p.parent.name for p in RESULTS.glob(f"*/{STORE_FILE}"))


def test_every_study_with_a_store_is_found():
    assert "headline" in STUDIES


@pytest.mark.parametrize("study", STUDIES)
def test_a_published_report_regenerates_from_its_store(tmp_path, monkeypatch, study):
    published = RESULTS / study
    sweep_dir = tmp_path / study
    sweep_dir.mkdir()
    shutil.copy2(published / STORE_FILE, sweep_dir / STORE_FILE)
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the files are the check, not the W&B run
    out = pathlib.Path(report.write_report(str(sweep_dir), plots=False))
    # A study whose experiment declares no claims (scale_predictor_cpu) has no claims.md.
    assert (out / "claims.md").exists() == (published / "claims.md").exists()
    for name in ("summary.csv", "claims.md"):  # as publish installs them: runs/STUDY named
        if not (published / name).exists():
            continue
        regenerated = (out / name).read_text().replace(str(sweep_dir), f"runs/{study}")
        assert regenerated == (published / name).read_text(), name
