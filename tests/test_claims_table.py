"""The cross-study claims table (experiments/results/claims.csv, claims.parquet) and the README's
results index are generated from the published claims.md files, and fail here when stale."""

from __future__ import annotations

import re
import shutil

import pandas as pd
import pytest
from helpers import REPO

from scale_ablation import claims_table

RESULTS = REPO / "experiments" / "results"
STUDIES = sorted(p.parent.name for p in RESULTS.glob("*/claims.md"))


def test_the_table_and_the_readme_index_are_not_stale():
    assert claims_table.stale(REPO) == [], "run python -m scale_ablation.claims_table"


def test_the_parquet_holds_what_the_csv_holds():
    frame = pd.read_parquet(RESULTS / "claims.parquet")
    assert claims_table.claims_csv(frame) == (RESULTS / "claims.csv").read_text()


@pytest.mark.parametrize("study", STUDIES)
def test_a_row_per_claim_with_the_verdicts_claims_md_gives(study):
    """Counted another way: the headings and verdict words of the study's claims.md, and the
    smallest Holm p printed under each claim."""
    text = (RESULTS / study / "claims.md").read_text()
    table = pd.read_csv(RESULTS / "claims.csv")
    rows = table[table["study"] == study]
    headings = re.findall(r"^## (\d+)\. ", text, re.M)
    assert list(rows["claim"]) == [int(h) for h in headings]
    assert list(rows["verdict"]) == re.findall(r"Verdict[^\n]*?: \*\*(\w+(?: \w+)?)\*\*", text)
    for (_, row), section in zip(rows.iterrows(), re.split(r"^## \d+\. ", text, flags=re.M)[1:],
                                 strict=True):
        holm = [float(h) for h in re.findall(r"Holm ([0-9.e+-]+)", section)]
        if holm:
            assert row["holm_p"] == pytest.approx(min(holm), rel=1e-6)
            assert row["deciding"] in section
        else:
            assert pd.isna(row["holm_p"]) and row["tests"] == 0


def test_the_index_names_the_decided_claims():
    index = (REPO / "README.md").read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    table = pd.read_csv(RESULTS / "claims.csv")
    for row in table.itertuples():
        line = next(x for x in index.splitlines() if f"[{row.study}](" in x)
        if row.verdict in ("supported", "contradicted"):
            assert f"{row.claim}. {row.name}" in line


def test_a_changed_verdict_makes_the_index_stale(tmp_path):
    """A copy of the repository's published scale_one_fan_in: written, then its claims.md changed (a
    verdict headed by caveats with colons, as a smoke run's is), the check names the files."""
    root = tmp_path / "repo"
    (root / "experiments" / "results").mkdir(parents=True)
    shutil.copy2(REPO / "experiments" / "scale_one_fan_in.py",
                 root / "experiments" / "scale_one_fan_in.py")
    shutil.copytree(RESULTS / "scale_one_fan_in",
                    root / "experiments" / "results" / "scale_one_fan_in")
    shutil.copy2(RESULTS / "index.csv", root / "experiments" / "results" / "index.csv")
    (root / "README.md").write_text("# x\n\n## Results\n\nText.\n\n| old |\n|---|\n\n## Next\n")
    claims_table.write(root)
    assert claims_table.stale(root) == []
    readme = (root / "README.md").read_text()
    assert readme.startswith("# x\n\n## Results\n\nText.\n\n| study | runs |")
    assert readme.endswith("|\n\n## Next\n") and "| old |" not in readme
    claims = root / "experiments" / "results" / "scale_one_fan_in" / "claims.md"
    text = claims.read_text()
    changed = re.sub(r"^Verdict[^\n]*?: \*\*supported\*\*", "Verdict (one seed per setting: no "
                     "interval can be formed): **inconclusive**", text, count=1, flags=re.M)
    assert changed != text
    claims.write_text(changed)
    assert sorted(claims_table.stale(root)) == sorted(
        str(root / p) for p in ("README.md", "experiments/results/claims.csv",
                                "experiments/results/claims.parquet"))
    claims_table.write(root)
    table = pd.read_csv(root / "experiments" / "results" / "claims.csv")
    assert table["verdict"].iloc[0] == "inconclusive"
    assert "inconclusive: 1" in (root / "README.md").read_text()
