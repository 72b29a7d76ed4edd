"""The run set is known, not guessed (issue 50, path 2): every run the grid names and the
directory lacks, every folder no record names, every run whose files disagree is listed in the
report with its path; a published study missing a run is reported, never silently smaller. A
Hypothesis property over random deletions and edits of a sweep directory (written without
training, `claims_sweep`): the report never prints a verdict the complete directory would not
without naming what was changed."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import claims_sweep
import pytest
from helpers import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scale_ablation import report
from scale_ablation.records import study_store

RESULTS = REPO / "experiments" / "results"


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    os.environ.setdefault("WANDB_MODE", "disabled")
    sweep = claims_sweep.build(tmp_path_factory.mktemp("complete"))
    return sweep, report_of(sweep)


def report_of(sweep: pathlib.Path) -> tuple[str, str, list[str]]:
    """(summary.md, claims.md, verdicts) of a fresh report of `sweep`."""
    out = pathlib.Path(report.write_report(str(sweep), plots=False))
    claims = (out / "claims.md").read_text()
    return (out / "summary.md").read_text(), claims, claims_sweep.verdicts(claims)


def copy_of(sweep: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(sweep, target, ignore=shutil.ignore_patterns("report"))
    return target


def record(sweep: pathlib.Path, name: str = "sweep.json") -> dict:
    return json.loads((sweep / name).read_text())


def rewrite(sweep: pathlib.Path, value: dict, name: str = "sweep.json") -> None:
    (sweep / name).write_text(json.dumps(value))


def names(sweep: pathlib.Path) -> list[str]:
    return [entry["name"] for entry in record(sweep)["runs"]]


# --------------------------------------------------------------------------- each path


def test_a_deleted_summary_is_damaged_not_interrupted(complete, tmp_path):
    sweep = copy_of(complete[0], tmp_path / "sweep")
    victim = names(sweep)[0]
    (sweep / victim / "summary.json").unlink()
    summary, claims, _ = report_of(sweep)
    assert f"- {victim}: damaged (sweep.json says completed, but it has no summary.json)" \
        in summary
    assert f"under {sweep}/" in summary
    assert claims.startswith(f"**{len(names(sweep)) - 1} of {len(names(sweep))} runs finished**")


def test_a_recorded_run_without_files_is_missing(complete, tmp_path):
    sweep = copy_of(complete[0], tmp_path / "sweep")
    entries = record(sweep)
    entries["runs"].append({"name": "policy=none,lr=0.5,seed=0", "status": "completed",
                            "overrides": {"policy": "none", "train.lr": 0.5, "train.seed": 0}})
    rewrite(sweep, entries)
    summary, claims, _ = report_of(sweep)
    assert ("- policy=none,lr=0.5,seed=0: missing (sweep.json says completed, but it has no "
            "run files)") in summary
    total = len(entries["runs"])
    assert claims.startswith(f"**{total - 1} of {total} runs finished**")


def test_a_run_dropped_from_sweep_json_is_kept_and_named(complete, tmp_path):
    sweep = copy_of(complete[0], tmp_path / "sweep")
    entries = record(sweep)
    dropped = entries["runs"].pop(4)["name"]
    rewrite(sweep, entries)
    summary, _, found = report_of(sweep)
    csv = (sweep / "report" / "summary.csv").read_text()
    assert len(csv.strip().splitlines()) == len(entries["runs"]) + 2  # header + every run
    assert f"- {dropped}: completed (sweep.json does not record it; its files are used)" \
        in summary
    assert found == claims_sweep.COMPLETE


def test_a_refined_json_missing_its_round_is_detected(complete, tmp_path):
    sweep = copy_of(complete[0], tmp_path / "sweep")
    refined = [entry["name"] for entry in record(sweep, "refined.json")["rounds"][0]]
    rewrite(sweep, {"rounds": []}, "refined.json")  # valid JSON, one round short
    summary, _, _ = report_of(sweep)
    for name in refined:
        assert f"- {name}: completed (neither the experiment's grid nor refined.json" in summary
    # And with sweep.json rewritten without them too, their folders are still named.
    entries = record(sweep)
    entries["runs"] = [e for e in entries["runs"] if e["name"] not in refined]
    rewrite(sweep, entries)
    summary, _, _ = report_of(sweep)
    for name in refined:
        assert f"- {name}: run files that no record of the sweep names" in summary


def test_a_damaged_refined_json_is_refused_before_anything_is_written(complete, tmp_path):
    sweep = copy_of(complete[0], tmp_path / "sweep")
    (sweep / "refined.json").write_text('{"rounds": [[{"name": "x", "ov')
    with pytest.raises(ValueError, match=r"refined\.json"):
        report.write_report(str(sweep), plots=False)
    assert not (sweep / "report").exists()


def test_a_run_directory_is_no_sweep(complete, tmp_path):
    sweep = copy_of(complete[0], tmp_path / "sweep")
    run = sweep / names(sweep)[0]
    with pytest.raises(ValueError, match=r"is a run directory .* not a sweep"):
        report.write_report(str(run), plots=False)
    assert not (run / "report").exists()


@pytest.mark.parametrize("kept_as", ["store", "run folders"])
def test_a_published_study_missing_a_run_says_so(tmp_path, monkeypatch, kept_as):
    """The scale_one_fan_in study's store with one run taken out, as a store and extracted to run
    folders: 5 of 6 runs, said at the head of claims.md and in each claim's arms."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(REPO)  # sweep.json names its experiment file from the repository
    study = study_store.read_store(str(RESULTS / "scale_one_fan_in" / study_store.STORE_FILE))
    total = len(study.runs)
    victim = study.runs.pop(0).name
    target = tmp_path / "headline"
    if kept_as == "store":
        target.mkdir()
        study_store.write_store(study, str(target / study_store.STORE_FILE))
    else:
        study_store.write_run_dirs(study, str(target))
    summary, claims, _ = report_of(target)
    assert claims.startswith(f"**{total - 1} of {total} runs finished**")
    assert f"- {victim}: missing (sweep.json says completed, but it has no run files)" in summary
    assert f"{total - 1} of {total} runs of its arms finished" in claims


# --------------------------------------------------------------------------- the property

EDITS = ("delete_run", "delete_summary", "delete_config", "delete_metrics", "unrecord",
         "unrecord_and_delete", "status_failed", "status_preempted", "status_diverged",
         "recorded_pending", "stray_folder", "drop_refined_round")


def edit(sweep: pathlib.Path, kind: str, index: int) -> str | None:
    """Apply one edit to the run at `index`; return the name it touches that the report must
    name when its verdicts move (None: an edit that changes no result, sweep.json's status
    of a run whose files say it finished)."""
    entries = record(sweep)
    if not entries["runs"]:
        return None
    entry = entries["runs"][index % len(entries["runs"])]
    run = sweep / entry["name"]
    if kind == "delete_run":
        shutil.rmtree(run, ignore_errors=True)
    elif kind.startswith("delete_"):
        (run / f"{kind.removeprefix('delete_')}.{'jsonl' if kind == 'delete_metrics' else 'json'}"
         ).unlink(missing_ok=True)
    elif kind.startswith("unrecord"):
        entries["runs"].remove(entry)
        rewrite(sweep, entries)
        if kind == "unrecord_and_delete":
            shutil.rmtree(run, ignore_errors=True)
    elif kind.startswith("status_") and (run / "summary.json").is_file():
        summary = json.loads((run / "summary.json").read_text())
        if summary["status"] == kind.removeprefix("status_"):
            return None  # no edit
        (run / "summary.json").write_text(json.dumps(
            {**summary, "status": kind.removeprefix("status_")}))
    elif kind == "recorded_pending":
        entry["status"] = "pending"
        rewrite(sweep, entries)
        return None
    elif kind == "stray_folder":
        stray = sweep / f"policy=stray,seed={index}"
        shutil.copytree(run, stray, dirs_exist_ok=True) if run.is_dir() else None
        return stray.name if stray.is_dir() else None
    elif kind == "drop_refined_round":
        rewrite(sweep, {"rounds": []}, "refined.json")
        return "refined.json"
    return entry["name"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(EDITS), st.integers(0, 100)), min_size=1, max_size=4))
def test_no_verdict_without_naming_what_changed(complete, tmp_path, edits):
    sweep, (_, _, before) = complete
    edited = copy_of(sweep, tmp_path / "edited")
    touched = {name for kind, index in edits if (name := edit(edited, kind, index))}
    try:
        summary, claims, after = report_of(edited)
    except ValueError as error:  # a refusal prints no verdict, and names the damaged file
        assert any(name in str(error) for name in touched), (edits, error)
        return
    assert len(after) == len(before)
    # Stronger than the verdicts alone: whether or not they moved, every run an edit touched
    # is named (a deleted run of three seeds may leave the verdicts as they were by chance).
    listed = {line[2:].split(": ")[0] for line in summary.splitlines() if line.startswith("- ")}
    refined = {e["name"] for e in record(sweep, "refined.json")["rounds"][0]}
    # A run whose folder, sweep.json entry and refined.json round are all gone has left no
    # trace to name (the experiment's grid does not name refined points); the round's loss is
    # named through its other runs.
    still = {e["name"] for r in record(edited, "refined.json")["rounds"] for e in r}
    erased = {name for name in refined - still - set(names(edited)) if not (edited / name).exists()}
    for name in touched - erased:
        if name == "refined.json":  # the round's runs are what the report must name
            assert {run for run in refined if (edited / run).is_dir()} <= listed, summary
        else:
            assert name in listed, (name, edits, summary)
    if after != before:  # and the claims say that they rest on part of the run set
        assert claims.startswith("**") or any(f"- {n}" in summary for n in touched), claims
