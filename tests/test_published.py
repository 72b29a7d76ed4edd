"""A published study regenerates from its own run files: experiments/results/headline/run_files holds
each run's config.json, metrics.jsonl and summary.json (no checkpoints) and the sweep's record;
the report written from a copy of them gives the committed summary.csv and claims.md."""

from __future__ import annotations

import csv
import pathlib
import shutil

from helpers import REPO

from scale_ablation import report

PUBLISHED = REPO / "experiments" / "results" / "headline"


def rows(path: pathlib.Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_headline_report_regenerates_from_its_run_files(tmp_path):
    sweep_dir = tmp_path / "headline"
    shutil.copytree(PUBLISHED / "run_files", sweep_dir)
    out = pathlib.Path(report.write_report(str(sweep_dir)))
    assert rows(out / "summary.csv") == rows(PUBLISHED / "summary.csv")
    regenerated = (out / "claims.md").read_text().replace(str(sweep_dir), "runs/headline")
    assert regenerated == (PUBLISHED / "claims.md").read_text()
