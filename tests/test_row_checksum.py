"""Every metrics.jsonl row carries a CRC-32 of its fields (issue 34): a line damaged in a way
that still parses (one digit changed) is refused or recomputed like a torn line, naming it;
rows written before the checksum existed still read.

The checksum is recomputed here with zlib and json directly, not through the code under test.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import zlib

import pytest
from helpers import tiny_config

from scale_ablation import report
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import hooks, train

ROWS = [
    {"step": 0, "val/loss": 5.54321, "val/bpb": 7.99718},
    {"step": 2, "train/loss": 4.123456789, "train/lr": 1e-7, "attn/layer0/entropy": 0.5,
     "train/grad_norm": math.inf, "note": "ünïcode"},
    {"step": 4, "train/loss": 3.25, "train/diverged": 0.0, "flags": [1, 2]},
]


RESULTS = ("status", "steps_completed", "final_train_loss", "final_val_loss", "final_val_bpb")


def metric_rows(workdir) -> list[dict]:
    """The rows as read, without their timings (perf/*), which no two runs share."""
    return [{k: v for k, v in row.items() if not k.startswith("perf/")}
            for row in RunFiles(workdir).read_metrics()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict, list[dict]]:
    """The reference: the tiny run trained in one go (checkpoints at 5 and 10)."""
    workdir = tmp_path_factory.mktemp("reference") / "run"
    summary = train.train(tiny_config(), workdir)
    return {k: summary[k] for k in RESULTS}, metric_rows(workdir)


def crc_of(fields: dict) -> int:
    """The documented checksum: CRC-32 of the row's JSON with sorted keys and no spaces."""
    return zlib.crc32(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def written(tmp_path: pathlib.Path, rows=ROWS) -> RunFiles:
    files = RunFiles(tmp_path / "run")
    for row in rows:
        files.append_metrics(row["step"], row)
    return files


def change_a_digit(line: str, key: str = "train/loss") -> str:
    """`line` with the last digit of `key`'s value changed (the line still parses)."""
    match = re.search(rf'"{re.escape(key)}": -?[0-9.e+-]*([0-9])', line)
    assert match, line
    digit = match.group(1)
    return line[:match.start(1)] + str((int(digit) + 1) % 10) + line[match.end(1):]


def test_each_line_carries_the_crc32_of_its_fields(tmp_path):
    files = written(tmp_path)
    lines = files.metrics_path.read_text().splitlines()
    assert len(lines) == len(ROWS)
    for line in lines:
        row = json.loads(line)
        stored = row.pop("crc32")
        assert stored == crc_of(row)


def test_an_intact_file_round_trips_without_the_checksum(tmp_path):
    files = written(tmp_path)
    expected = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in row.items()} for row in ROWS]
    assert files.read_metrics() == expected
    assert files.scan_metrics().damage is None
    # Cut back and rewritten on resume: the kept rows keep their checksums.
    assert files.truncate_metrics_after(2) == expected[:2]
    assert all("crc32" in json.loads(line) for line in files.metrics_path.read_text().splitlines())
    assert files.read_metrics() == expected[:2]


def test_one_changed_digit_is_refused_naming_the_line(tmp_path):
    files = written(tmp_path)
    lines = files.metrics_path.read_text().splitlines(keepends=True)
    lines[1] = change_a_digit(lines[1])
    json.loads(lines[1])  # still parses: only the checksum tells
    files.metrics_path.write_text("".join(lines))
    scan = files.scan_metrics()
    assert scan.rows == [ROWS[0]]
    assert scan.damage.startswith(f"{files.metrics_path}:2: damaged line (crc32 ")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: damaged line \(crc32 "):
        files.read_metrics()


def test_a_changed_step_or_checksum_is_refused_too(tmp_path):
    for key in ("step", "crc32"):
        files = written(tmp_path / key)
        lines = files.metrics_path.read_text().splitlines(keepends=True)
        lines[2] = change_a_digit(lines[2], key)
        files.metrics_path.write_text("".join(lines))
        assert files.scan_metrics().damage.startswith(f"{files.metrics_path}:3: damaged line"), key


def test_rows_without_checksums_still_read_and_a_resume_appends_checked_ones(tmp_path):
    """A file written before the checksum: read as it is; rows appended after it (a resumed
    run) have one; a row without one after rows with one is damage."""
    files = RunFiles(tmp_path / "run")
    files.workdir.mkdir()
    old = [{"step": 0, "val/loss": 5.5}, {"step": 2, "train/loss": 4.25}]
    files.metrics_path.write_text("".join(json.dumps(row) + "\n" for row in old))
    assert files.read_metrics() == old
    files.append_metrics(4, {"train/loss": 3.5})
    assert files.read_metrics() == [*old, {"step": 4, "train/loss": 3.5}]
    with open(files.metrics_path, "a") as f:
        f.write(json.dumps({"step": 6, "train/loss": 3.0}) + "\n")
    assert files.scan_metrics().damage == (f"{files.metrics_path}:4: damaged line (no crc32 "
                                           "after rows with one)")


def test_a_changed_digit_before_the_newest_checkpoint_resumes_before_it(tmp_path, uninterrupted):
    """Step 6's loss changed by one digit, checkpoints at 5 and 9: the resume recomputes from 5
    and ends with the uninterrupted run's rows and results."""
    workdir = tmp_path / "run"
    (stop,) = hooks.hooks_from_environment({hooks.SIGNAL_AT_ENV: "9:SIGTERM"})
    assert train.train(tiny_config(), workdir, extra_hooks=[stop])["status"] == "preempted"
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert [json.loads(line)["step"] for line in lines] == [0, 2, 4, 5, 6, 8]
    lines[4] = change_a_digit(lines[4])
    path.write_text("".join(lines))
    summary = train.train(tiny_config(), workdir)
    assert {k: summary[k] for k in RESULTS} == uninterrupted[0]
    assert uninterrupted[0]["status"] == "completed"
    assert metric_rows(workdir) == uninterrupted[1]


def test_report_refuses_a_finished_run_with_a_changed_digit_naming_the_line(tmp_path):
    workdir = tmp_path / "sweep" / "run"
    train.train(tiny_config(), workdir)
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines) if '"train/loss"' in line)
    lines[number] = change_a_digit(lines[number])
    path.write_text("".join(lines))
    with pytest.raises(ValueError, match=rf"metrics.jsonl:{number + 1}: damaged line \(crc32 "):
        report.write_report(str(tmp_path / "sweep"))
