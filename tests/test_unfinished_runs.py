"""Verdicts rest only on finished runs (issue 50, path 1): a sweep killed before any run
finished, runs that failed or were interrupted, a report taken while a sweep still holds its
directory. The sweeps are written without training (`claims_sweep`), with known verdicts."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import claims_sweep
import pytest
from helpers import REPO

from scale_ablation import report
from scale_ablation.analysis import claims as claims_lib
from scale_ablation.analysis import verdicts

ENV = {**os.environ, "WANDB_MODE": "disabled", "JAX_PLATFORMS": "cpu"}
RUNS = len(claims_sweep.POLICIES) * (len(claims_sweep.LRS) + 1) * len(claims_sweep.SEEDS)


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    os.environ.setdefault("WANDB_MODE", "disabled")
    return claims_sweep.build(tmp_path_factory.mktemp("complete"))


def copy_of(complete, tmp_path):
    shutil.copy(complete.parent / "claims_experiment.py", tmp_path / "claims_experiment.py")
    sweep = tmp_path / "sweep"
    shutil.copytree(complete, sweep, ignore=shutil.ignore_patterns("report"))
    record = json.loads((sweep / "sweep.json").read_text())
    record["config"] = str(tmp_path / "claims_experiment.py")
    (sweep / "sweep.json").write_text(json.dumps(record))
    return sweep


def claims_md(sweep) -> str:
    return (pathlib.Path(report.write_report(str(sweep), plots=False)) / "claims.md").read_text()


def kill_every_run(sweep, keep_rows: int = 2) -> None:
    """Each run as a sweep killed at its first steps leaves it: a config.json, the first
    metrics rows, no summary.json; sweep.json says pending."""
    record = json.loads((sweep / "sweep.json").read_text())
    for entry in record["runs"]:
        run = sweep / entry["name"]
        (run / "summary.json").unlink()
        rows = (run / "metrics.jsonl").read_text().splitlines()[:keep_rows]
        (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
        entry["status"] = "pending"
    (sweep / "sweep.json").write_text(json.dumps(record))


def test_the_complete_sweep_supports_every_claim(complete):
    assert claims_sweep.verdicts(claims_md(complete)) == claims_sweep.COMPLETE


def test_a_sweep_killed_before_any_run_finished_supports_nothing(complete, tmp_path):
    sweep = copy_of(complete, tmp_path)
    kill_every_run(sweep)
    text = claims_md(sweep)
    assert set(claims_sweep.verdicts(text)) == {"inconclusive"}, text
    assert text.splitlines()[0].startswith(f"**0 of {RUNS} runs finished**")
    assert "no run finished" in text  # the caveat of the whole sweep stays
    assert f"0 of {RUNS // 2} runs of its arms finished" in text


def test_failed_runs_count_neither_for_nor_against_trains_smoothly(complete, tmp_path):
    """none's runs at 1e-2 diverged (a failure); made failed (no result), that LR is unknown:
    "none does not train smoothly" can no longer be supported by it, nor refuted."""
    sweep = copy_of(complete, tmp_path)
    for run in sweep.glob("policy=none,lr=0.01,*"):
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    text = claims_md(sweep)
    assert claims_sweep.verdicts(text)[1] == "inconclusive", text
    assert "unknown at LR 0.01" in text
    assert f"{RUNS // 2 - 3} of {RUNS // 2} runs of its arms finished" in text
    assert text.splitlines()[0].startswith(f"**{RUNS - 3} of {RUNS} runs finished**")


def rows(policy: str, lr: float, statuses: list[str], failures: str = "") -> list[dict]:
    return [{"policy": policy, "d_k": 32, "lr": lr, "seed": seed, "status": status,
             "failures": failures if status in ("completed", "diverged") else "",
             "final_val_bpb": 2.0 if status == "completed" else None,
             "baseline_bigram_bpb": 3.3, "task": "lm"}
            for seed, status in enumerate(statuses)]


def test_an_lr_of_unfinished_runs_is_neither_smooth_nor_rough():
    unstable = claims_lib.Claim("none does not train smoothly",
                                claims_lib.Unstable(("none",), expect_unstable=True))
    smooth = claims_lib.Claim("none trains smoothly",
                              claims_lib.Unstable(("none",), expect_unstable=False))
    failed = rows("none", 1e-3, ["failed", "preempted"]) + rows("none", 1e-2, ["interrupted"] * 2)
    assert verdicts.judge(unstable, failed).verdict == "inconclusive"
    # Two clean runs and one that never finished: not known smooth, and not rough either.
    partly = rows("none", 1e-3, ["completed", "completed", "interrupted"])
    assert verdicts.judge(smooth, partly).verdict == "inconclusive"
    assert verdicts.judge(unstable, partly).verdict == "inconclusive"
    # A finished run with a failure kind makes its LR rough whatever the others did.
    rough = rows("none", 1e-3, ["diverged", "failed"], "diverged")
    assert verdicts.judge(unstable, rough).verdict == "supported"
    assert verdicts.judge(smooth, rough).verdict == "contradicted"


def test_limits_keeps_its_caveat_when_no_run_finished():
    found = verdicts.limits(rows("none", 1e-3, ["interrupted", "failed"]))
    assert any("no run finished" in line for line in found), found


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"scale_ablation.{module}", *args], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=300)


def test_the_reports_last_line_counts_the_finished_runs(complete, tmp_path):
    sweep = copy_of(complete, tmp_path)
    shutil.rmtree(next(sweep.glob("policy=none,lr=0.001,*")))
    result = run_module("report", str(sweep))
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last == f"{RUNS - 1} of {RUNS} runs finished: report written to {sweep / 'report'}"


HOLD = """
import sys, time
from scale_ablation.records import locking
locking.DirectoryLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_report_and_publish_refuse_while_a_sweep_holds_the_directory(complete, tmp_path):
    sweep = copy_of(complete, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(sweep)], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = run_module("report", str(sweep))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"PID {holder.pid}" in lines[0] and "--partial" in lines[0]
        assert not (sweep / "report").exists()
        published = run_module("publish", str(sweep), str(tmp_path / "published"))
        assert published.returncode == 2 and "--partial" in published.stderr
        assert not (tmp_path / "published").exists()
        partial = run_module("report", "--partial", str(sweep))
        assert partial.returncode == 0, partial.stderr
        assert (sweep / "report" / "claims.md").is_file()
    finally:
        holder.kill()
        holder.wait()
