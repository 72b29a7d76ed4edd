r"""Judge a published study's claims again from its summary.csv, by today's rules.

  python -m scale_ablation.rejudge experiments/results/dk_sweep_cpu [--config=FILE.py:VARIANT]

A published study keeps its report's rows (summary.csv, one line per run) even where its run
directories are gone. This reads those rows back, loads the claims the experiment file declares
(`--config`, else the spec named at the top of the study's claims.md) and rewrites claims.md with
`analysis.verdicts`: the failure taxonomy read from each row's own fields
(`failures.row_failures`), Holm over the study's family, TOST for claims of no difference. It
touches nothing else; `git diff` then shows which verdicts changed.
"""

from __future__ import annotations

import os
import re
import sys

from absl import flags

from scale_ablation import command_line
from scale_ablation.analysis.claims_markdown import write_claims
from scale_ablation.records.summary_csv import read_summary_csv
from scale_ablation.report import load_claims
from scale_ablation.training import experiment_files as experiment

_SPEC_LINE = re.compile(r"^# Claims tested by `([^`]+)`")
_COMMAND = re.compile(r"--workdir=([^`\s]+)")  # followed by ` or by flags (--refine ...)


def published_spec(study_dir: str) -> tuple[str | None, str | None]:
    """(experiment spec, sweep directory) named by the study's claims.md, if it has one."""
    path = os.path.join(study_dir, "claims.md")
    if not os.path.exists(path):
        return None, None
    with open(path) as f:
        text = f.read()
    spec, workdir = _SPEC_LINE.search(text), _COMMAND.search(text)
    return (spec.group(1) if spec else None), (workdir.group(1) if workdir else None)


def rejudge(study_dir: str, spec: str | None = None) -> str:
    """Rewrite study_dir/claims.md from study_dir/summary.csv; return its path."""
    named, workdir = published_spec(study_dir)
    spec = spec or named
    if spec is None:
        raise ValueError(f"{study_dir}: no claims.md naming the experiment; give --config")
    rows = read_summary_csv(os.path.join(study_dir, "summary.csv"))
    check_rows_match(rows, spec, os.path.join(study_dir, "summary.csv"))
    path = os.path.join(study_dir, "claims.md")
    # The study's records (refined.json) are its store's, not those of a runs/ folder here.
    if not write_claims(load_claims(spec), spec, workdir or study_dir, rows, path,
                        records_dir=study_dir):
        raise ValueError(f"{spec} declares no claims")
    return path


USAGE = "python -m scale_ablation.rejudge STUDY_DIR [--config=FILE.py:VARIANT]"


REQUIRED_COLUMNS = ("name", "policy", "d_k", "lr", "seed", "status")


def check_rows_match(rows: list[dict], spec: str, path: str) -> None:
    """Raise ValueError unless the rows are runs of `spec`'s grid: each row has the columns the
    verdicts read, and the rows vary the fields the experiment's grid varies (their
    `override:FIELD` columns), so that one study's claims never judge another study's rows."""
    columns = set().union(*(row.keys() for row in rows)) if rows else set()
    if missing := [name for name in REQUIRED_COLUMNS if name not in columns]:
        raise ValueError(f"{path}: no column {', '.join(missing)}: not a report's summary.csv")
    varied = {key.removeprefix("override:") for key in columns if key.startswith("override:")}
    grid = {key for point in experiment.load_grid(spec) for key in point}
    if varied and varied != grid:
        raise ValueError(f"{path} holds runs that vary {', '.join(sorted(varied))}, but {spec}'s "
                         f"grid varies {', '.join(sorted(grid)) or 'nothing'}: the rows are not "
                         "this experiment's (give the study's own --config)")


def main(argv: list[str], spec: str | None = None) -> int:
    if len(argv) != 2:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(argv[1], "summary.csv")):
        print(f"error: {argv[1]} holds no summary.csv", file=sys.stderr)
        return 2
    try:
        print(f"claims rewritten: {rejudge(argv[1], spec)}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # Flags defined only when run: a process that imports several commands (the tests) would
    # otherwise meet two definitions of --config.
    flags.DEFINE_string("config", None, "Experiment spec; default: the one claims.md names.")
    command_line.start(lambda argv: main(argv, flags.FLAGS.config), positionals=1, usage=USAGE)
