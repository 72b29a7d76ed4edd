r"""Publish a sweep for review: its runs' records and the report written from them, into the repository.

  python -m scale_ablation.publish runs/dk_exponent_cpu experiments/results/dk_exponent_cpu
  python -m scale_ablation.publish --record_only runs/dk_sweep_cpu experiments/pending/dk_sweep_cpu

DEST/runs.parquet, the study store (`records.study_store`), gets each finished (completed or
diverged) run's record of truth (`records.run_files`: config.json, metrics.jsonl, summary.json,
train_losses.jsonl; no checkpoints, no W&B folder) and the sweep's record (sweep.json,
refined.json). The report is then written from a copy of that store, not from SOURCE, so what is
published is exactly what regenerates (tests/test_published.py); its summary.csv, summary.md,
claims.md and plots go beside runs.parquet, with the copy's path written as
`runs/STUDY` (STUDY: DEST's name), the path the study's command names. Every README that quotes
DEST/claims.md between `<!-- claims: PATH -->` markers (DEST's own, the repository's) gets the new
text; the claims table (experiments/results/claims.csv, .parquet) and the README's results index
are generated again (`claims_table`).

The record files alone mark a run finished, so a sweep directory seeded from them trains only
what is missing: `python -m scale_ablation.records.study_store extract DEST runs/STUDY`, then
the study's sweep command, resumes a study on a machine that kept nothing
(tests/test_publish.py). `--record_only` writes DEST/runs.parquet and nothing else, no report
and no README: the stash of a sweep still running, committed as each ensemble lands so that a
sweep longer than a session outlives its machine (`launch/cpu_studies.sh`). Stashes go under
experiments/pending/, not results/, where every store must regenerate the report beside it.

SOURCE is only read. The new DEST (the report, the store and DEST's own files such as its
README) is built whole in a staging folder beside it and swapped in by one rename
(`records.staging`): a publish killed at any point leaves the previous publish or the new one,
and the staging folders a killed publish left (`.STUDY-publishing-*`) go at the next.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import sys
import tempfile

from absl import flags

from scale_ablation import claims_table, command_line, report
from scale_ablation.model import plugins
from scale_ablation.records import jsonfiles, staging, study_store
from scale_ablation.records.run_files import FINISHED

REPORT_SUFFIXES = (".md", ".csv", ".png")
PUBLISHING = "publishing"  # the name part of publish's staging folders beside DEST
_QUOTE = re.compile(r"<!-- claims: (\S+) -->\n.*?<!-- end claims -->", re.DOTALL)


def check_paths(source: str, dest: str) -> None:
    """Raise ValueError naming what is wrong with SOURCE or DEST, before anything is written."""
    if not os.path.isfile(os.path.join(source, "sweep.json")):
        raise ValueError(f"{source} is not a sweep directory (no sweep.json)")
    if not finished_runs(source):
        raise ValueError(f"{source} has no finished run yet")
    src, dst = pathlib.Path(source).resolve(), pathlib.Path(dest).resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        raise ValueError(f"{dest} and {source} must not contain each other")
    if not dst.parent.is_dir():
        raise ValueError(f"{dst.parent} does not exist")
    if dst.exists() and not dst.is_dir():
        raise ValueError(f"{dest} exists and is not a directory")


def finished_runs(source: str) -> list[str]:
    """The runs under SOURCE whose summary.json says they finished (completed or diverged): a
    preempted run's record is half a run, whose checkpoint does not travel with it."""
    return [name for name in sorted(os.listdir(source))
            if os.path.isfile(path := os.path.join(source, name, "summary.json"))
            and (jsonfiles.read_json(path) or {}).get("status") in FINISHED]


def store_run_record(source: str, target: str) -> int:
    """Write TARGET/runs.parquet from each finished run's record files and the sweep's record;
    return the number of runs stored."""
    study = study_store.read_run_dirs(source, finished_only=True)
    os.makedirs(target, exist_ok=True)
    study_store.write_store(study, os.path.join(target, study_store.STORE_FILE))
    return len(study.runs)


def _install_report(written: str, copy: str, dest: str, study: str) -> None:
    """Replace DEST's report files by those in `written`, the copy's path named runs/STUDY.
    Plots the new report no longer draws go; other hand-written files (README.md) stay."""
    for name in os.listdir(dest):
        if name.endswith(".png") and not os.path.exists(os.path.join(written, name)):
            os.remove(os.path.join(dest, name))
    for name in sorted(os.listdir(written)):
        path = os.path.join(written, name)
        if not name.endswith(REPORT_SUFFIXES):
            continue  # the report's W&B folder
        if name.endswith(".png"):
            shutil.copy2(path, os.path.join(dest, name))
        else:
            text = pathlib.Path(path).read_text().replace(copy, f"runs/{study}")
            pathlib.Path(dest, name).write_text(text)


def keep_hand_written(dest: str, new: str, written: str) -> None:
    """Copy into `new` what DEST holds besides the publish: its README.md and other files of
    its own, not the runs' records (runs.parquet, or the run_files folder stores replaced), not
    plots (a plot the new report no longer draws goes), not a report file the new report
    rewrites, not a staging folder."""
    if not os.path.isdir(dest):
        return
    rewritten = set(os.listdir(written))
    for name in os.listdir(dest):
        path = os.path.join(dest, name)
        if name in ("run_files", study_store.STORE_FILE) or name.endswith(".png") or (
                name in rewritten) or (
                name.startswith(".") and os.path.isdir(path)):
            continue
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(new, name), symlinks=True)
        else:
            shutil.copy2(path, os.path.join(new, name))


def quote(claims_text: str, path: str) -> str:
    """The README block quoting a claims.md at `path` (relative to the repository)."""
    lines = claims_text.strip().splitlines()
    body = "\n".join(">" + (" " + line if line else "") for line in lines)
    return f"<!-- claims: {path} -->\n{body}\n<!-- end claims -->"


def requote(readme: pathlib.Path, root: pathlib.Path) -> bool:
    """Refresh `readme`'s quoted claims blocks; return whether the text changed. (The results
    index is generated from the claims table: `claims_table`.)"""
    text = readme.read_text()
    new = _QUOTE.sub(lambda m: quote((root / m.group(1)).read_text(), m.group(1)), text)
    if new != text:
        jsonfiles.write_text_atomic(readme, new)
    return new != text


def repository_root(path: str) -> pathlib.Path | None:
    """The nearest folder at or above `path` holding pyproject.toml, if any."""
    for folder in [pathlib.Path(path).resolve(), *pathlib.Path(path).resolve().parents]:
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


def stash(source: str, dest: str) -> int:
    """Replace DEST/runs.parquet by SOURCE's finished runs' records (one rename); return how
    many."""
    check_paths(source, dest)
    # The staging folders (`.run_files-*`) a killed stash of an earlier version left there.
    staging.remove_leftovers(os.path.join(dest, "run_files"), "staging")
    return store_run_record(source, dest)


def publish(source: str, dest: str) -> tuple[int, list[str]]:
    """Publish SOURCE into DEST; return (runs published, READMEs whose quotes changed)."""
    check_paths(source, dest)
    study = os.path.basename(os.path.normpath(dest))
    parent = os.path.dirname(os.path.abspath(dest))
    staging.remove_leftovers(dest, PUBLISHING)  # a publish killed earlier left its scratch
    with tempfile.TemporaryDirectory(prefix=f".{study}-{PUBLISHING}-{os.getpid()}-",
                                     dir=parent) as scratch:
        copy = os.path.join(scratch, study)
        runs = store_run_record(source, copy)
        written = report.write_report(copy)
        # DEST whole, built beside it and swapped in by one rename: a kill leaves the old
        # publish or the new one, never a report beside a store it was not written from.
        with staging.staged(dest, PUBLISHING) as new:
            keep_hand_written(dest, new, written)
            _install_report(written, copy, new, study)
            shutil.copy2(os.path.join(copy, study_store.STORE_FILE),
                         os.path.join(new, study_store.STORE_FILE))
    root = repository_root(dest)
    if root is None:  # no repository to resolve the quoted paths against
        return runs, []
    readmes = [pathlib.Path(dest, "README.md"), root / "README.md"]
    changed = [str(doc) for doc in readmes if doc.is_file() and requote(doc, root)]
    # The claims table and the README's results index, generated from every study's claims.md.
    if (root / claims_table.RESULTS / claims_table.INDEX_FILE).is_file():
        before = (root / "README.md").read_text()
        claims_table.write(root)
        if (root / "README.md").read_text() != before and str(root / "README.md") not in changed:
            changed.append(str(root / "README.md"))
    return runs, changed


USAGE = "python -m scale_ablation.publish [--record_only] SOURCE_SWEEP_DIR DEST_STUDY_DIR"


def main(argv: list[str], record_only: bool = False, partial: bool = False) -> int:
    if len(argv) != 3:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    # A stash is of a running sweep by design; a publish of one would judge part of its runs.
    if not (record_only or partial) and (busy := report.sweep_in_progress(argv[1])):
        print(f"error: {busy}", file=sys.stderr)
        return 2
    try:
        if record_only:
            print(f"stashed {stash(argv[1], argv[2])} runs' records in "
                  f"{os.path.join(argv[2], study_store.STORE_FILE)}")
            return 0
        plugins.load(report.sweep_imports(argv[1]) if os.path.isdir(argv[1]) else [])
        runs, changed = publish(argv[1], argv[2])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"published {runs} runs and their report to {argv[2]}")
    for doc in changed:
        print(f"requoted {doc}")
    return 0


if __name__ == "__main__":
    flags.DEFINE_bool("record_only", False, "Write DEST/runs.parquet only (no report, no README): "
                      "the stash of a sweep still running.")
    flags.DEFINE_bool("partial", False, "Publish a sweep still running (one holding SOURCE's "
                      "lock) from the runs finished so far.")
    command_line.start(lambda argv: main(argv, flags.FLAGS.record_only, flags.FLAGS.partial),
                       positionals=2,
                       usage=USAGE)
