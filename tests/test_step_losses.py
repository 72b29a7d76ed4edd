"""Spikes judged on every step's training loss: the vectorised rule against the plain one, a
spike between two logged steps seen on every step's losses and missed by the rows alone (the
summary's field read by the report, the rows for older runs), and train_losses.jsonl as the
loop writes it: every step once, chunked programs included, and a resumed run's file equal to
an uninterrupted run's."""

from __future__ import annotations

import itertools
import math
import shutil
import statistics

import numpy as np
import pytest
from helpers import read_json, tiny_config

from scale_ablation import report
from scale_ablation.analysis import failures
from scale_ablation.records.run_files import STEP_LOSSES_FILE, RunFiles, StepLosses
from scale_ablation.training import train

WARMUP, LOG_EVERY, STEPS = 50, 10, 1000


def plain_spike_step(losses, *, warmup_steps, noise_factor=failures.SPIKE_NOISE_FACTOR,
                     min_rise=failures.SPIKE_MIN_RISE, window=failures.SPIKE_WINDOW):
    """The rule as first written, one loss at a time with `statistics`."""
    series = [(s, v) for s, v in losses if math.isfinite(v)]
    post = [v for s, v in series if s > warmup_steps]
    diffs = [b - a for a, b in itertools.pairwise(post)]
    noise = 0.0
    if len(diffs) >= 3:
        centre = statistics.median(diffs)
        noise = 1.4826 * statistics.median(abs(d - centre) for d in diffs) / math.sqrt(2)
    bound = max(noise_factor * noise, min_rise)
    for i, (step, value) in enumerate(series):
        if step > warmup_steps and i >= failures.SPIKE_MIN_HISTORY and value - statistics.median(
                v for _, v in series[max(0, i - window):i]) > bound:
            return step
    return None


@pytest.mark.parametrize("seed", range(12))
def test_the_vectorised_rule_is_the_plain_rule(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    steps = np.sort(rng.choice(np.arange(1, 5 * n + 1), size=n, replace=False)).tolist()
    values = (2 + 3 * np.exp(-np.arange(n) / 50) + rng.normal(0, 0.05, n)).tolist()
    for i in rng.choice(n, size=min(n, 3), replace=False):
        values[i] += float(rng.choice([0.05, 0.3, 1.0, math.nan]))
    losses = list(zip(steps, values, strict=True))
    warmup = int(rng.integers(0, 60))
    assert failures.spike_step(losses, warmup_steps=warmup) == plain_spike_step(
        losses, warmup_steps=warmup)


def every_step(spike_at: int | None, seed: int = 0) -> list[tuple[int, float]]:
    rng = np.random.default_rng(seed)
    losses = [(s, 2.0 + 3.0 * math.exp(-s / 200) + rng.normal(0, 0.03))
              for s in range(1, STEPS + 1)]
    if spike_at is not None:
        losses[spike_at - 1] = (spike_at, losses[spike_at - 1][1] + 1.0)  # one step, ~30 σ
    return losses


def rows_of(losses: list[tuple[int, float]]) -> list[dict]:
    """The metrics rows of those losses: train/loss at every LOG_EVERY-th step only."""
    return [{"step": s, "train/loss": v} for s, v in losses if s % LOG_EVERY == 0]


def judge(rows, **kwargs) -> list[str]:
    return failures.classify(rows, warmup_steps=WARMUP, unigram_loss=None, bigram_loss=None,
                             **kwargs)


def test_a_spike_between_logged_steps_is_seen_on_every_step_and_missed_by_the_rows():
    losses = every_step(spike_at=505)
    rows = rows_of(losses)
    assert 505 not in {r["step"] for r in rows}
    assert judge(rows) == []  # the rows never saw it
    assert judge(rows, step_losses=losses) == ["spiked"]
    fields = failures.summary_spike(losses, warmup_steps=WARMUP)
    assert fields == {"spike_step": 505, "spike_judged_on": failures.EVERY_STEP}
    assert judge(rows, summary=fields) == ["spiked"]  # the report's reading of a summary
    assert judge(rows_of(every_step(spike_at=None)), step_losses=every_step(None)) == []


def write_run(sweep, name: str, losses, summary_extra: dict) -> dict:
    config = tiny_config(**{"train.steps": STEPS, "train.warmup_steps": WARMUP}).to_dict()
    files = RunFiles(sweep / name)
    files.write_config(config)
    for row in rows_of(losses):
        files.append_metrics(row["step"], row)
    files.append_metrics(STEPS, {"val/loss": 2.0, "val/bpb": 2.0 / math.log(2)})
    files.write_summary({"status": "completed", "steps_completed": STEPS, "final_val_loss": 2.0,
                         "final_val_bpb": 2.0 / math.log(2), **summary_extra})
    return {"name": name, "overrides": {}, "config": config, "summary": files.read_summary(),
            "metrics": files.read_result_metrics()}


def test_the_report_reads_the_summary_s_every_step_spike_and_older_runs_rows(tmp_path):
    losses = every_step(spike_at=505)
    new = write_run(tmp_path, "new", losses, failures.summary_spike(losses, warmup_steps=WARMUP))
    old = write_run(tmp_path, "old", losses, {"spike_step": None})  # before the field existed
    new_row, old_row = report.summarise_run(new), report.summarise_run(old)
    assert new_row["spike_step"] == 505 and "spiked" in new_row["failures"].split(";")
    assert old_row["spike_step"] is None and "spiked" not in old_row["failures"].split(";")


def test_the_file_keeps_chunks_and_a_resume_cuts_it_back(tmp_path):
    path = tmp_path / STEP_LOSSES_FILE
    record = StepLosses(path, None)
    for step in range(1, 8):
        record.add(step, 1.0 / step if step != 3 else math.nan)
        if step in (2, 6, 7):  # programs of 2, 4 and 1 steps
            record.write()
    assert len(path.read_text().splitlines()) == 3
    again = StepLosses(path, 7).losses
    assert [s for s, _ in again] == list(range(1, 8)) and math.isnan(again[2][1])
    # Kept as float32: the file's shortest digits read back as the float32 written.
    assert [np.float32(v) for s, v in again if s != 3] == [np.float32(1.0 / s) for s in
                                                           (1, 2, 4, 5, 6, 7)]
    with open(path, "a") as f:
        f.write('{"step": 8, "train/lo')  # a kill mid-write
    resumed = StepLosses(path, 5)  # from a checkpoint at 5: steps 6 and 7 are retrained
    assert [s for s, _ in resumed.losses] == [1, 2, 3, 4, 5]
    assert [s for s, _ in StepLosses(path, 5).losses] == [1, 2, 3, 4, 5]  # the file agrees
    assert resumed.complete() is not None
    gap = StepLosses(tmp_path / "gap.jsonl", None)
    gap.add(4, 1.0)  # a run resumed from one made before the file existed
    assert gap.complete() is None and StepLosses(None, None).complete() is None


def file_losses(workdir) -> list[tuple[int, float]]:
    return StepLosses(workdir / STEP_LOSSES_FILE, 10**9).losses


def test_the_loop_writes_every_step_once_and_a_resumed_run_continues_its_file(tmp_path):
    # Chunks of 4, cut at 5 and 10; every checkpoint kept, for the copy killed before the end.
    config = tiny_config(**{"train.steps_per_call": 4, "checkpoint.keep_finished": True})
    summary = train.train(config, tmp_path / "run")
    losses = file_losses(tmp_path / "run")
    assert [s for s, _ in losses] == list(range(1, 11))
    rows = [r for r in RunFiles(tmp_path / "run").read_metrics() if "train/loss" in r]
    assert len(rows) == 5  # every second step: the file holds the other five
    for row in rows:  # the logged rows' losses are the same steps' in the file (float32)
        assert np.float32(losses[row["step"] - 1][1]) == np.float32(row["train/loss"])
    assert summary["spike_judged_on"] == failures.EVERY_STEP
    assert read_json(tmp_path / "run" / "summary.json")["spike_judged_on"] == "every_step"
    # Killed after step 10's losses were written but before its checkpoint and summary: the
    # rerun resumes from step 5, cuts the file back to it and writes steps 6-10 again.
    shutil.copytree(tmp_path / "run", tmp_path / "killed")
    (tmp_path / "killed" / "summary.json").unlink()
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "10")
    resumed = train.train(config, tmp_path / "killed")
    again = file_losses(tmp_path / "killed")
    assert [s for s, _ in again] == list(range(1, 11))  # each step once
    np.testing.assert_allclose([v for _, v in again], [v for _, v in losses], rtol=1e-5)
    assert resumed["spike_judged_on"] == failures.EVERY_STEP
