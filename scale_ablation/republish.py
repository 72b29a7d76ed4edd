r"""Write published studies' tables and claims again from their own stores, in place.

  python -m scale_ablation.republish experiments/results/STUDY [...]
  python -m scale_ablation.republish --all                   # every study with a runs.parquet

When the report changes what it computes from runs (a new summary.csv column, a new rule in
the verdicts), each published study's summary.csv, summary.md and claims.md must be written
again from its runs.parquet, as tests/test_published.py checks. For each study this writes the
report from a copy of its store without plots (the figures stay as they are: `publish` redraws
them), installs the tables with the copy's path written as runs/STUDY, then requotes the READMEs
and regenerates the claims table once. It trains nothing and leaves runs.parquet as it is.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile

from absl import flags

from scale_ablation import claims_table, command_line, publish, report
from scale_ablation.records import study_store

TABLES = ("summary.csv", "summary.md", "claims.md")
USAGE = "python -m scale_ablation.republish (--all | STUDY_DIR ...)"


def check_studies(studies: list[str]) -> None:
    """Raise ValueError naming the first argument that is not a published study."""
    for study in studies:
        if not os.path.isfile(os.path.join(study, study_store.STORE_FILE)):
            raise ValueError(f"{study} is not a published study (no {study_store.STORE_FILE})")


def republish_tables(study_dir: str) -> list[str]:
    """Rewrite `study_dir`'s tables from a copy of its store; return the files that changed."""
    study = os.path.basename(os.path.normpath(study_dir))
    changed = []
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, study)
        os.mkdir(copy)
        shutil.copy2(os.path.join(study_dir, study_store.STORE_FILE), copy)
        written = pathlib.Path(report.write_report(copy, plots=False))
        for name in TABLES:
            if not (written / name).exists():
                continue
            text = (written / name).read_text().replace(copy, f"runs/{study}")
            target = pathlib.Path(study_dir, name)
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
                changed.append(str(target))
    return changed


def republish(studies: list[str]) -> list[str]:
    """Every study's tables, then the READMEs' quotes and the claims table; the changed files."""
    check_studies(studies)
    changed = [path for study in studies for path in republish_tables(study)]
    root = publish.repository_root(studies[0]) if studies else None
    if root is None:
        return changed
    readmes = [*(pathlib.Path(s, "README.md") for s in studies), root / "README.md"]
    changed += [str(doc) for doc in readmes if doc.is_file() and publish.requote(doc, root)]
    if (root / claims_table.RESULTS / claims_table.INDEX_FILE).is_file():
        claims_table.write(root)
    return changed


def main(argv: list[str], every: bool = False) -> int:
    studies = argv[1:]
    if every:
        results = pathlib.Path(claims_table.RESULTS)
        studies = sorted(str(p.parent) for p in results.glob(f"*/{study_store.STORE_FILE}"))
    if not studies:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    try:
        check_studies(studies)
    except ValueError as error:
        print(f"republish: {error}", file=sys.stderr)
        return 2
    for path in republish(studies):
        print(f"changed: {path}")
    return 0


if __name__ == "__main__":
    flags.DEFINE_bool("all", False, "Every study under experiments/results with a store.")
    command_line.start(lambda argv: main(argv, flags.FLAGS.all), positionals=(0, 10_000),
                       usage=USAGE)
