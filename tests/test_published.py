"""A published study regenerates from its own run files: experiments/results/STUDY/run_files holds
each run's config.json, metrics.jsonl and summary.json (no checkpoints) and the sweep's record;
the report written from a copy of them gives the committed summary.csv and claims.md."""

from __future__ import annotations

import csv
import pathlib
import shutil

import pytest
from helpers import REPO

from scale_ablation import report

RESULTS = REPO / "experiments" / "results"
STUDIES = sorted(p.parent.name for p in RESULTS.glob("*/run_files"))


def rows(path: pathlib.Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_every_study_with_run_files_is_found():
    assert "headline" in STUDIES


@pytest.mark.parametrize("study", STUDIES)
def test_a_published_report_regenerates_from_its_run_files(tmp_path, monkeypatch, study):
    published = RESULTS / study
    sweep_dir = tmp_path / study
    shutil.copytree(published / "run_files", sweep_dir)
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the files are the check, not the W&B run
    out = pathlib.Path(report.write_report(str(sweep_dir), plots=False))
    assert rows(out / "summary.csv") == rows(published / "summary.csv")
    regenerated = (out / "claims.md").read_text().replace(str(sweep_dir), f"runs/{study}")
    assert regenerated == (published / "claims.md").read_text()
