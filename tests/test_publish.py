"""Publishing a sweep: its record files only (a study store), the report written from them, the
READMEs requoted. The sweep published here is scale_one_fan_in's own runs (the earlier main job),
written back from its store, so its report must come out as the committed one (itself checked by test_published against
the same store)."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, snapshot

from scale_ablation import claims_table, publish
from scale_ablation.records import study_store

STUDY = "scale_one_fan_in"
HEADLINE = REPO / "experiments" / "results" / STUDY
STORE = HEADLINE / study_store.STORE_FILE


def stored(path: pathlib.Path) -> str:
    """A store's runs and sweep records, as exact JSON text (key order, floats to the bit)."""
    study = study_store.read_store(str(path))
    return json.dumps([[run.__dict__ for run in study.runs], study.files])


def headline_runs(target: pathlib.Path) -> None:
    """The study's run directories, written back from its store."""
    study_store.write_run_dirs(study_store.read_store(str(STORE)), str(target))
TITLE = "Scale 1 at fan_in, d_k 128 (the earlier main job)"  # index.csv's
INDEX_ROW = (f"| {TITLE} | 5 | contradicted | [{STUDY}](experiments/results/{STUDY}/README.md) "
             "| contradicted | — |")


def rows(path: pathlib.Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def sweep(tmp_path) -> pathlib.Path:
    """The study's sweep as a finished run directory holds it: checkpoints and a W&B folder
    beside the record files, one run started but not finished, and one preempted."""
    source = tmp_path / "runs" / STUDY
    headline_runs(source)
    for run in sorted(p for p in source.iterdir() if p.is_dir()):
        (run / "checkpoints" / "10").mkdir(parents=True)
        (run / "checkpoints" / "10" / "state").write_bytes(b"\0" * 64)
        (run / "wandb").mkdir()
        (run / "wandb_run_id.txt").write_text("abc\n")
    (source / "policy=none,lr=0.01,seed=0").mkdir()
    (source / "policy=none,lr=0.01,seed=0" / "config.json").write_text("{}")
    preempted = source / "policy=none,lr=0.03,seed=0"  # half a run: its checkpoint stays
    shutil.copytree(source / "policy=none,lr=0.001,seed=0", preempted)
    summary = json.loads((preempted / "summary.json").read_text())
    (preempted / "summary.json").write_text(json.dumps({**summary, "status": "preempted"}))
    return source


@pytest.fixture
def repository(tmp_path) -> pathlib.Path:
    """A repository whose README indexes the study with stale verdicts and whose study README
    quotes a stale claims.md; its experiment file and the index's hand-written part
    (index.csv) as the repository holds them."""
    root = tmp_path / "repo"
    study = root / "experiments" / "results" / STUDY
    study.mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "README.md").write_text(f"# x\n\n## Results\n\n{INDEX_ROW}\n")
    shutil.copy2(REPO / "experiments" / f"{STUDY}.py", root / "experiments" / f"{STUDY}.py")
    shutil.copy2(REPO / "experiments" / "results" / "index.csv",
                 root / "experiments" / "results" / "index.csv")
    (study / "README.md").write_text(
        f"# Old\n\n<!-- claims: experiments/results/{STUDY}/claims.md -->\n> # old\n"
        "<!-- end claims -->\n")
    (study / "old_plot.png").write_bytes(b"stale")
    return root


def test_publishing_copies_the_record_files_and_the_report_they_regenerate(sweep, repository):
    before = snapshot(sweep)
    dest = repository / "experiments" / "results" / STUDY
    runs, changed = publish.publish(str(sweep), str(dest))

    # the study's own runs: not the preempted one, nor the one never finished; their record
    # files whole (step losses included) and the sweep's record, byte for byte
    assert runs == study_store.run_count(str(STORE)) == 6
    assert stored(dest / study_store.STORE_FILE) == stored(STORE)
    assert study_store.study_file(str(dest), "sweep.json") == (sweep / "sweep.json").read_text()
    assert not (dest / "run_files").exists()
    assert snapshot(sweep) == before  # the source is only read

    assert rows(dest / "summary.csv") == rows(HEADLINE / "summary.csv")
    assert (dest / "claims.md").read_text() == (HEADLINE / "claims.md").read_text()
    pngs = sorted(p.name for p in dest.glob("*.png"))
    assert pngs == sorted(p.name for p in HEADLINE.glob("*.png"))  # the stale plot is gone
    assert not [p.name for p in dest.parent.iterdir() if p.name.startswith(".")]  # no staging

    claims = (dest / "claims.md").read_text()
    assert publish.quote(claims, f"experiments/results/{STUDY}/claims.md") in (
        dest / "README.md").read_text()
    # the index and the claims table generated from the published claims.md (was 5 runs)
    assert claims_table.stale(repository) == []
    index = (repository / "README.md").read_text()
    assert INDEX_ROW not in index and f"| {TITLE} | {runs} | **supported**" in index
    assert sorted(changed) == sorted([str(dest / "README.md"), str(repository / "README.md")])


@pytest.mark.parametrize("case", ["no_sweep_record", "nothing_finished", "dest_inside_source"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, sweep, capsys, case):
    dest = tmp_path / "results" / STUDY
    dest.parent.mkdir()
    if case == "no_sweep_record":
        (sweep / "sweep.json").unlink()
    elif case == "nothing_finished":
        for summary in sweep.glob("*/summary.json"):
            summary.unlink()
    else:
        dest = sweep / "published"
    before = snapshot(tmp_path)
    assert publish.main(["publish", str(sweep), str(dest)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert snapshot(tmp_path) == before



def test_a_stash_is_the_finished_runs_record_files_and_nothing_else(tmp_path, sweep):
    dest = tmp_path / "pending" / STUDY
    dest.parent.mkdir()
    dest.mkdir()
    (dest / study_store.STORE_FILE).write_bytes(b"an earlier stash's")  # replaced
    assert publish.main(["publish", str(sweep), str(dest)], record_only=True) == 0
    assert [p.name for p in dest.iterdir()] == [study_store.STORE_FILE]
    assert stored(dest / study_store.STORE_FILE) == stored(STORE)


def test_a_sweep_seeded_from_a_stash_trains_nothing(tmp_path, sweep):
    """A machine that comes back empty resumes a study from its stash: the record files alone
    mark every run finished, so the sweep compiles nothing and leaves every run's files as they
    were."""
    publish.stash(str(sweep), str(tmp_path / "stash"))
    sweep_dir = tmp_path / "resumed"
    stashed = study_store.read_store(str(tmp_path / "stash" / study_store.STORE_FILE))
    study_store.write_run_dirs(stashed, str(sweep_dir))
    before = snapshot(sweep_dir)
    done = subprocess.run(
        [sys.executable, "-m", "scale_ablation.sweep", f"--config={REPO}/experiments/{STUDY}.py",
         f"--workdir={sweep_dir}"], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "WANDB_MODE": "disabled"}, check=True).stdout
    runs = study_store.run_count(str(STORE))
    assert f"[sweep] {runs}/{runs} done, 0 running, 0 failed" in done
    assert "[sweep] compiled 0 programs" in done

    def run_files(tree: dict) -> dict:  # the sweep's own record (sweep.json, .lock) is its to write
        return {k: v for k, v in tree.items() if k.startswith("policy=")}
    assert run_files(snapshot(sweep_dir)) == run_files(before) != {}
