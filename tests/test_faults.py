"""Damaged run files are refused or repaired, never read as something else (issue 34).

Each case damages a run the way a crash, a full disk or an operator can: `checkpoints/` replaced
by a file, metrics.jsonl cut mid-line or at a line boundary or damaged in the middle, a
checkpoint's digest file removed. The run either refuses in one line, having changed nothing,
or falls back saying so; where it continues, its rows and final numbers are compared with an
uninterrupted run of the same config.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest
from helpers import TINY_RUN as TINY
from helpers import read_json, snapshot, tiny_config
from test_train_faults import (
    EXPERIMENT,
    flip_a_bit,
    largest_file,
    main_args,
    metric_rows,
    one_error_line,
    results,
    run_module,
    stopped_at,
    uninterrupted,
)

from scale_ablation import report, sweep
from scale_ablation.records import checkpoints
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import train

assert uninterrupted  # a fixture, used by name below


def cut_metrics(workdir: pathlib.Path, keep_lines: int, partial: str = "") -> None:
    """metrics.jsonl cut after `keep_lines` whole lines, plus `partial` (a torn line)."""
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:keep_lines]) + partial)


def steps_of(workdir: pathlib.Path) -> list[int]:
    return [row["step"] for row in RunFiles(workdir).scan_metrics().rows]


# ------------------------------------------------ 1. checkpoints/ that is not a directory


def test_a_checkpoints_file_is_one_line_and_keeps_the_history(tmp_path):
    workdir = tmp_path / "run"
    assert stopped_at(workdir, 7)["status"] == "preempted"
    rows = (workdir / "metrics.jsonl").read_text()
    for step_dir in (workdir / "checkpoints").iterdir():
        for path in sorted(step_dir.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        step_dir.rmdir()
    (workdir / "checkpoints").rmdir()
    (workdir / "checkpoints").write_text("not a directory")
    before = snapshot(tmp_path)
    line = one_error_line(run_module("main", *main_args(workdir)))
    assert "checkpoints is not a directory" in line and "aside" in line
    assert snapshot(tmp_path) == before
    assert (workdir / "metrics.jsonl").read_text() == rows


# ------------------------------------------------ 2. metrics.jsonl torn, cut or damaged


def test_a_torn_row_before_the_newest_checkpoint_resumes_from_an_older_one(
        tmp_path, uninterrupted, capfd):
    """Rows 0, 2, 4, 5, 6 then a torn row: checkpoint 7's rows are not all there, so the run
    resumes from 5 (one line saying so) and ends with every row of the uninterrupted run."""
    workdir = tmp_path / "run"
    assert stopped_at(workdir, 7)["status"] == "preempted"
    assert steps_of(workdir) == [0, 2, 4, 5, 6]
    cut_metrics(workdir, 4, partial='{"step": 6, "train/lo')
    summary = train.train(tiny_config(), workdir)
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert "step 7" in warnings[0] and "metrics.jsonl:5" in warnings[0]
    assert "resuming from step 5" in warnings[0]
    reference_summary, reference_rows = uninterrupted
    assert results(summary) == results(reference_summary)
    assert metric_rows(workdir) == reference_rows


def test_rows_cut_at_a_line_boundary_are_found_by_the_checkpoints_row_count(
        tmp_path, uninterrupted):
    workdir = tmp_path / "run"
    assert stopped_at(workdir, 7)["status"] == "preempted"
    cut_metrics(workdir, 4)  # rows 0, 2, 4, 5: a clean cut, step 6's row gone
    train.train(tiny_config(), workdir)
    assert metric_rows(workdir) == uninterrupted[1]


def test_a_damaged_middle_line_resumes_before_it(tmp_path, uninterrupted):
    workdir = tmp_path / "run"
    assert stopped_at(workdir, 9)["status"] == "preempted"  # checkpoints 5 and 9
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 6  # steps 0, 2, 4, 5, 6, 8
    lines[4] = "#" + lines[4][1:]  # step 6's row, no longer JSON; step 8's row intact after it
    path.write_text("".join(lines))
    summary = train.train(tiny_config(), workdir)
    assert results(summary) == results(uninterrupted[0])
    assert metric_rows(workdir) == uninterrupted[1]


def test_a_damaged_first_row_with_checkpoints_is_one_line_naming_it(tmp_path):
    workdir = tmp_path / "run"
    stopped_at(workdir, 7)
    cut_metrics(workdir, 0, partial='{"step": 0, "val/lo')
    before = snapshot(tmp_path)
    line = one_error_line(run_module("main", *main_args(workdir)))
    assert "metrics.jsonl:1" in line and "no intact checkpoint" in line
    assert snapshot(tmp_path) == before


def test_report_refuses_a_finished_run_whose_rows_end_early_naming_it(tmp_path):
    workdir = tmp_path / "sweep" / "run"
    train.train(tiny_config(), workdir)
    cut_metrics(workdir, 4)  # rows 0..5 of a run completed at step 10
    with pytest.raises(ValueError, match=r"metrics.jsonl: its rows end at step 5, before "
                                         r"step 10"):
        report.write_report(str(tmp_path / "sweep"))
    line = one_error_line(run_module("report", str(tmp_path / "sweep")))
    assert str(workdir / "metrics.jsonl") in line


def test_report_refuses_a_finished_run_with_a_torn_last_row(tmp_path):
    workdir = tmp_path / "sweep" / "run"
    train.train(tiny_config(), workdir)
    path = workdir / "metrics.jsonl"
    path.write_text(path.read_text()[:-5])  # the last row loses its end and its newline
    with pytest.raises(ValueError, match=r"metrics.jsonl:\d+: torn last line"):
        report.write_report(str(tmp_path / "sweep"))


def test_a_rerun_of_a_finished_run_with_damaged_rows_repairs_them(tmp_path, uninterrupted,
                                                                  capfd):
    """From the checkpoint before the damage, which only `checkpoint.keep_finished` keeps once
    the run has finished (without it: tests/test_keep_finished.py)."""
    workdir = tmp_path / "run"
    train.train(tiny_config(**{"checkpoint.keep_finished": True}), workdir)
    cut_metrics(workdir, 5, partial='{"step": 8, "tr')
    summary = train.train(tiny_config(), workdir)
    err = capfd.readouterr().err
    assert "its rows are recomputed" in err and "resuming from step 5" in err
    assert results(summary) == results(uninterrupted[0])
    assert metric_rows(workdir) == uninterrupted[1]
    assert RunFiles(workdir).read_result_metrics()  # whole again


# ------------------------------------------------ 3. a checkpoint without its digest file


def test_a_checkpoint_without_its_digest_is_not_restored_unverified(tmp_path, uninterrupted,
                                                                    capfd):
    workdir = tmp_path / "run"
    assert stopped_at(workdir, 7)["status"] == "preempted"
    step_dir = workdir / "checkpoints" / "7"
    (step_dir / checkpoints.DIGEST_NAME).unlink()
    flip_a_bit(largest_file(step_dir))  # restored unverified, this would change the state
    summary = train.train(tiny_config(), workdir)
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "no sha256sums.json" in warnings[0]
    assert "resuming from step 5" in warnings[0]
    assert results(summary) == results(uninterrupted[0])


def test_no_checkpoint_with_a_digest_is_one_line(tmp_path):
    workdir = tmp_path / "run"
    stopped_at(workdir, 7)
    for step in (5, 7):
        (workdir / "checkpoints" / str(step) / checkpoints.DIGEST_NAME).unlink()
    before = snapshot(tmp_path)
    line = one_error_line(run_module("main", *main_args(workdir)))
    assert "no intact checkpoint" in line and "no sha256sums.json" in line
    assert snapshot(tmp_path) == before


# ------------------------------------------------ 4. a full disk (a real, small tmpfs)


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a fresh tmpfs of `size` under tmp_path; grow(size) enlarges it. Skips
    where tmpfs cannot be mounted (not root)."""
    mounted = []

    def mount(size: str) -> pathlib.Path:
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                 str(disk)], capture_output=True, text=True, check=False)
        if result.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(disk)
        return disk

    def grow(disk: pathlib.Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)

    yield mount, grow
    for disk in mounted:
        subprocess.run(["umount", str(disk)], check=False)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "Logging error" not in text, text


# Three points at which the disk fills (the default command keeps the middle one; ~15 s each).
@pytest.mark.parametrize("size", [pytest.param("200k", marks=pytest.mark.slow), "450k",
                                  pytest.param("700k", marks=pytest.mark.slow)])
def test_a_full_disk_is_one_line_exit_1_and_resumes_when_space_returns(
        small_disk, size, uninterrupted):
    mount, grow = small_disk
    disk = mount(size)
    workdir = disk / "run"
    args = main_args(workdir, **{"wandb.mode": "offline"})
    line = one_error_line(run_module("main", *args), code=1)
    assert "no space left on device" in line and "rerun to resume" in line
    grow(disk, "64m")
    rerun = run_module("main", *args)
    assert rerun.returncode == 0, rerun.stderr
    no_traceback(rerun)
    assert metric_rows(workdir) == uninterrupted[1]


@pytest.mark.slow  # a sweep in a subprocess on a small disk, ~20 s; a run on one: the fast tier
def test_a_sweep_on_a_full_disk_exits_4_naming_its_incomplete_runs(small_disk, tmp_path):
    mount, grow = small_disk
    disk = mount("700k")
    experiment_file = tmp_path / "two_seeds.py"
    experiment_file.write_text(EXPERIMENT.replace(
        ', "data.source": "text:no_such_file.txt"', "").format(
            tiny={**TINY, "wandb.mode": "offline"}))
    args = (f"--config={experiment_file}", f"--workdir={disk / 'sweep'}")
    result = run_module("sweep", *args)
    no_traceback(result)
    assert result.returncode == sweep.EXIT_INCOMPLETE, result.stdout + result.stderr
    assert "2 of 2 runs have no result: seed=0 (failed), seed=1 (failed)" in result.stdout
    grow(disk, "64m")
    rerun = run_module("sweep", *args)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    statuses = {r["status"] for r in read_json(disk / "sweep" / "sweep.json")["runs"]}
    assert statuses == {"completed"}


# ------------------------------------------------ 9. a sweep holds the run directories it owns


def test_a_running_sweeps_run_directories_refuse_a_main(tmp_path, uninterrupted):
    """From the moment a sweep plans its runs it holds their directories: a `main` on one it
    has not reached is refused naming the sweep's process, while the sweep's own in-process
    training of it re-enters the lock."""
    sweep_dir = tmp_path / "sweep"
    points = [sweep.Point(f"seed={seed}", {}, tiny_config(**{"train.seed": seed}))
              for seed in (0, 1)]
    owned = sweep.hold_runs(str(sweep_dir), points)
    try:
        line = one_error_line(run_module("main", *main_args(sweep_dir / "seed=0")))
        assert "in use by" in line and f"PID {os.getpid()}" in line
        assert train.train(points[0].config, sweep_dir / "seed=0")["status"] == "completed"
    finally:
        for run_lock in owned.values():
            run_lock.release(remove_created=True)
    assert not (sweep_dir / "seed=1").exists()  # never started: no directory left
    assert results(read_json(sweep_dir / "seed=0" / "summary.json")) == results(
        uninterrupted[0])
