"""The study store (`records.study_store`): a sweep's run directories into one Parquet file and
back, read exactly as the run directories read, floats to the bit, key order, null against
absent, NaN and infinities included."""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import struct

import pyarrow.parquet as pq
import pytest
from helpers import REPO, snapshot

from scale_ablation import rejudge
from scale_ablation.records import jsonfiles, study_store
from scale_ablation.records.run_files import STEP_LOSSES_FILE, RunFiles, StepLosses

FINISHED_SUMMARY = {"status": "completed", "steps_completed": 20, "final_val_bpb": 2.5}


def identical(a, b) -> bool:
    """Same types all the way down, dicts in the same key order, floats bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def contents(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def written_sweep(root: pathlib.Path) -> pathlib.Path:
    """Three runs the way the training loop writes them, and a sweep.json naming a fourth that
    never started."""
    sweep = root / "sweep"
    names = ["policy=none,seed=0", "policy=inv_dk,seed=0", "policy=none,seed=1", "never"]
    for i, name in enumerate(names[:3]):
        files = RunFiles(sweep / name)
        files.write_config({"policy": name.split(",")[0][7:], "train": {"lr": 0.1 / 3, "seed": i},
                            "model": {"head_dim": 16, "qk_dim": 0}})
        for step in (0, 10, 20):
            row = {"train/loss": 4.0 / (step + 3), "lr": 1e-320 * step, "count": step}
            if step % 20 == 0:  # evaluation rows: other keys, another order
                row = {"val/bpb": math.pi * (i + 1), **row, "val/loss": None}
            files.append_metrics(step, row)
        if i < 2:  # the third has no summary: interrupted
            files.summary({**FINISHED_SUMMARY, "failures": [] if i else ["spiked"]})
        losses = StepLosses(sweep / name / STEP_LOSSES_FILE, None)
        for step in range(1, 21):
            losses.add(step, 4.0 / step if step != 7 else math.nan)
            if step % 10 == 0:
                losses.write()
    jsonfiles.write_json_atomic(sweep / "sweep.json", {"config": "x.py", "runs": [
        {"name": n, "overrides": {"policy": n[7:11], "train.seed": 0}, "status": "pending"}
        for n in names]})
    (sweep / "refined.json").write_text('{"rounds": [1,\n 2]}')  # not the writer's layout
    return sweep


def test_a_store_reads_back_as_its_run_directories_and_extracts_to_the_same_bytes(tmp_path):
    sweep = written_sweep(tmp_path)
    before = snapshot(sweep)
    path, runs = study_store.convert(str(sweep), str(tmp_path / "study"))
    assert runs == 3 and snapshot(sweep) == before  # the source is only read
    from_store = study_store.load_runs(str(tmp_path / "study"))
    assert identical(from_store, study_store.load_runs(str(sweep)))
    assert [r["name"] for r in from_store] == ["policy=none,seed=0", "policy=inv_dk,seed=0",
                                               "policy=none,seed=1"]
    assert from_store[2]["summary"] == {"status": "interrupted"}
    assert "val/loss" in from_store[0]["metrics"][0] and "val/loss" not in from_store[0]["metrics"][1]
    assert study_store.study_file(str(tmp_path / "study"), "refined.json") == '{"rounds": [1,\n 2]}'

    study_store.write_run_dirs(study_store.read_store(path), str(tmp_path / "extracted"))
    assert contents(tmp_path / "extracted") == contents(sweep)


def test_values_json_holds_come_back_exactly(tmp_path):
    """Rows written by hand as older writers and other tools did: NaN and Infinity tokens, no
    checksums, a key whose values mix int, float, lists and strings, subnormals, -0.0."""
    sweep = tmp_path / "sweep"
    run = sweep / "run"
    run.mkdir(parents=True)
    config = {"b": float("nan"), "a": [1, 1.0, -0.0, 5e-324, 2**62, True, None, "x"], "c": {}}
    (run / "config.json").write_text(json.dumps(config))
    rows = [{"step": 0, "loss": float("nan"), "mixed": 1, "nested": [1.5, None]},
            {"step": 1, "loss": float("inf"), "mixed": 1.0, "flag": True},
            {"step": 2, "loss": -float("inf"), "mixed": "one", "text": "é"},
            {"step": 3, "mixed": None, "loss": 0.1 + 0.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"status": "diverged", "steps_completed": 3,
                                                  "final_val_loss": float("-inf")}))
    study_store.convert(str(sweep), str(tmp_path / "study"))
    loaded = study_store.load_runs(str(tmp_path / "study"))
    assert identical(loaded, study_store.load_runs(str(sweep)))
    assert identical(loaded[0]["config"], json.loads(json.dumps(config)))
    assert [list(r) for r in loaded[0]["metrics"]] == [list(r) for r in rows]
    assert identical(loaded[0]["metrics"][3]["loss"], 0.30000000000000004)


def test_the_store_is_columnar_with_its_schema_version(tmp_path):
    sweep = written_sweep(tmp_path)
    path, _ = study_store.convert(str(sweep), str(tmp_path / "study"))
    parquet = pq.ParquetFile(path)
    assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    meta = json.loads(parquet.schema_arrow.metadata[b"scale_ablation.study_store"])
    assert meta["schema_version"] == study_store.SCHEMA_VERSION
    frame = study_store.read_table(path).to_pandas()
    assert list(frame["name"]) == [r["name"] for r in study_store.load_runs(str(sweep))]
    assert len(frame["metrics"][0]) == 3  # a list of rows per run
    losses = study_store.read_store(path).runs[0].train_losses
    assert [line["step"] for line in losses] == [1, 11]
    assert losses[0]["train/loss"][6] is None  # the non-finite step, as the file holds it


def test_the_metrics_as_one_flat_table_a_row_per_logged_row(tmp_path):
    sweep = written_sweep(tmp_path)
    path, _ = study_store.convert(str(sweep), str(tmp_path / "study"))
    frame = study_store.metrics_frame(path).to_pandas()
    runs = study_store.load_runs(str(sweep))
    assert len(frame) == sum(len(r["metrics"]) for r in runs) == 9
    assert list(frame["run"]) == [r["name"] for r in runs for _ in r["metrics"]]
    assert list(frame["step"]) == [row["step"] for r in runs for row in r["metrics"]]
    assert list(frame["count"]) == [row["count"] for r in runs for row in r["metrics"]]


def test_another_schema_version_is_refused_naming_it(tmp_path):
    sweep = written_sweep(tmp_path)
    table = study_store.to_table(study_store.read_run_dirs(str(sweep)))
    meta = json.loads(table.schema.metadata[b"scale_ablation.study_store"])
    table = table.replace_schema_metadata({b"scale_ablation.study_store":
                                           json.dumps({**meta, "schema_version": 99}).encode()})
    (tmp_path / "old").mkdir()
    pq.write_table(table, tmp_path / "old" / study_store.STORE_FILE)
    with pytest.raises(ValueError, match="schema version 99; this code reads version 1"):
        study_store.load_runs(str(tmp_path / "old"))


@pytest.mark.parametrize("argv, says", [
    (["convert", "{tmp}/missing"], "error: no such sweep directory: {tmp}/missing/run_files"),
    (["extract", "{tmp}", "{tmp}/out"], "error: {tmp} holds no runs.parquet"),
    (["convert"], "usage: python -m scale_ablation.records.study_store convert")])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, says):
    before = snapshot(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert study_store.main(["study_store", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(says.format(tmp=tmp_path))
    assert snapshot(tmp_path) == before


def test_rejudge_names_the_refined_rounds_its_store_records(tmp_path, monkeypatch):
    """A refined study's claims.md names `--refine --refine_rounds=N` from refined.json, which a
    published study keeps in its store: rejudged anywhere, its command line stays the one
    published (the study's workdir, the rounds)."""
    published = REPO / "experiments" / "results" / "init_gain_cpu"
    study = tmp_path / "init_gain_cpu"
    shutil.copytree(published, study)
    monkeypatch.chdir(REPO)  # the experiment file as claims.md names it
    rejudge.rejudge(str(study))
    command = [line for line in (study / "claims.md").read_text().splitlines()
               if line.startswith("Command:")]
    assert command and command == [line for line in (published / "claims.md").read_text()
                                   .splitlines() if line.startswith("Command:")]
    assert "--refine --refine_rounds=" in command[0]
