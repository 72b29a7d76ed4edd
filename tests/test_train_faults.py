"""Fault injection: nothing lost, nothing silently wrong.

Each case damages a run the way a user or an operator can (a kill before the first checkpoint,
a second writer, a failed sweep run, a damaged checkpoint, a changed schedule, an unreachable
W&B server, bad input, a full disk) and checks the outcome. Where the run continues, its final
numbers and its metrics.jsonl are compared with an uninterrupted run of the same config.
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
import socket
import subprocess
import sys
import textwrap

import pytest
from helpers import OWN_CACHE, QUICK, REPO, read_json, snapshot, tiny_config
from helpers import TINY_RUN as TINY

from scale_ablation import report, sweep
from scale_ablation.errors import ConfigError
from scale_ablation.records import checkpoints, locking
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import ensemble, hooks, train
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training.run_config import validate

ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
# absl log lines (WARNING:absl:..., W0101 12:00:00.0 ...) are not the error report.
ABSL_LOG = re.compile(r"^(WARNING|[WIE]\d{4} )")
RESULT_FIELDS = ("steps_completed", "final_train_loss", "final_val_loss", "final_val_bpb")



def results(summary: dict) -> dict:
    return {field: summary[field] for field in RESULT_FIELDS}


def metric_rows(workdir) -> list[dict]:
    """metrics.jsonl without the timings (perf/*), which no two runs share."""
    return [{k: v for k, v in row.items() if not k.startswith("perf/")}
            for row in RunFiles(workdir).read_metrics()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: TINY trained in one go (checkpoints at 5 and 10)."""
    workdir = tmp_path_factory.mktemp("reference") / "run"
    summary = train.train(tiny_config(), workdir)
    assert summary["status"] == "completed"
    return summary, metric_rows(workdir)


def stopped_at(workdir, step: int, signame: str = "SIGTERM", **overrides) -> dict:
    (stop,) = hooks.hooks_from_environment({hooks.SIGNAL_AT_ENV: f"{step}:{signame}"})
    return train.train(tiny_config(**overrides), workdir, extra_hooks=[stop])


def crash_at(step: int, error: Exception) -> hooks.Periodic:
    """A hook that raises `error` once step `step` is done: a crash of this attempt."""
    def crash(member, tick):
        if tick.step == step:
            raise error
    return hooks.Periodic(1, crash)


def run_module(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"scale_ablation.{module}", *args], cwd=REPO,
                          env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=300)


def main_args(workdir, **overrides) -> list[str]:
    return [f"--config={QUICK}", f"--workdir={workdir}",
            *experiment.override_flags({**TINY, **overrides})]


def one_error_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not ABSL_LOG.match(line)]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ------------------------------------------------ 1. killed before the first checkpoint


def test_a_crash_before_the_first_checkpoint_leaves_no_rows_behind(tmp_path, uninterrupted):
    workdir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="injected"):
        train.train(tiny_config(), workdir, extra_hooks=[crash_at(4, RuntimeError("injected"))])
    assert read_json(workdir / "summary.json")["status"] == "failed"
    assert [row["step"] for row in metric_rows(workdir)] == [0, 2]  # rows of the failed attempt
    summary = train.train(tiny_config(), workdir)
    reference_summary, reference_rows = uninterrupted
    assert results(summary) == results(reference_summary)
    assert metric_rows(workdir) == reference_rows  # steps 0, 2, ..., 10 once, same numbers


def test_a_sigkill_before_the_first_checkpoint_then_a_rerun_logs_each_step_once(tmp_path):
    workdir = tmp_path / "run"
    killed = run_module("main", *main_args(workdir),
                        env={hooks.SIGNAL_AT_ENV: "4:SIGKILL"})
    assert killed.returncode == -9
    assert [row["step"] for row in metric_rows(workdir)] == [0, 2, 4]  # killed after step 4's row
    assert not (workdir / "checkpoints").exists() or not os.listdir(workdir / "checkpoints")
    rerun = run_module("main", *main_args(workdir))
    assert rerun.returncode == 0, rerun.stderr
    assert [row["step"] for row in metric_rows(workdir)] == [0, 2, 4, 5, 6, 8, 10]


def test_a_changed_model_is_refused_without_a_checkpoint(tmp_path):
    workdir = tmp_path / "run"
    with pytest.raises(RuntimeError):
        train.train(tiny_config(), workdir, extra_hooks=[crash_at(2, RuntimeError("injected"))])
    before = snapshot(workdir)
    with pytest.raises(ConfigError, match=r"model\.head_dim differ"):
        train.train(tiny_config(**{"model.head_dim": 8}), workdir)
    assert snapshot(workdir) == before


# ------------------------------------------------ 5. changed schedule on rerun


@pytest.mark.parametrize("change", [{"train.steps": 12}, {"train.lr": 1e-2}])
def test_a_finished_run_refuses_another_schedule_unless_extended(tmp_path, change):
    workdir = tmp_path / "run"
    first = train.train(tiny_config(), workdir)
    before = snapshot(workdir)
    field = next(iter(change))
    with pytest.raises(ConfigError, match=rf"{field}=.*--extend"):
        train.train(tiny_config(**change), workdir)
    assert snapshot(workdir) == before
    assert train.train(tiny_config(), workdir) == first  # the same settings: the result


def test_extend_continues_a_finished_run_to_more_steps(tmp_path):
    workdir = tmp_path / "run"
    train.train(tiny_config(), workdir)
    summary = train.train(tiny_config(**{"train.steps": 14}), workdir, extend=True)
    assert summary["status"] == "completed" and summary["steps_completed"] == 14
    steps = [row["step"] for row in metric_rows(workdir)]
    assert steps == sorted(set(steps)) and steps[-1] == 14  # each step once, in order
    assert read_json(workdir / "config.json")["train"]["steps"] == 14


def test_a_half_finished_run_refuses_another_schedule(tmp_path):
    workdir = tmp_path / "run"
    assert stopped_at(workdir, 7)["status"] == "preempted"
    before = snapshot(workdir)
    with pytest.raises(ConfigError, match=r"train\.warmup_steps=.*--extend"):
        train.train(tiny_config(**{"train.warmup_steps": 3}), workdir)
    assert snapshot(workdir) == before


def test_main_refuses_a_changed_steps_in_one_line(tmp_path):
    workdir = tmp_path / "run"
    train.train(tiny_config(), workdir)
    line = one_error_line(run_module("main", *main_args(workdir, **{"train.steps": 12})))
    assert "train.steps=10" in line and "--extend" in line


# ------------------------------------------------ 2. one writer per directory


HOLDER = textwrap.dedent("""
    import sys, time
    from scale_ablation.records import locking
    locking.DirectoryLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def held(tmp_path):
    """A run directory locked by another process; yields (directory, process)."""
    workdir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir)], cwd=REPO, env=ENV,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    yield workdir, process
    process.kill()
    process.wait()


def test_a_second_writer_is_refused_naming_the_holder(held):
    workdir, process = held
    before = snapshot(workdir)
    with pytest.raises(locking.DirectoryBusyError,
                       match=rf"in use by PID {process.pid} on host {re.escape(socket.gethostname())}"):
        train.train(tiny_config(), workdir)
    assert snapshot(workdir) == before
    line = one_error_line(run_module("main", *main_args(workdir)))
    assert f"PID {process.pid}" in line
    assert snapshot(workdir) == before


def test_a_killed_holder_leaves_no_stale_lock(held):
    workdir, process = held
    process.kill()
    process.wait()
    assert train.train(tiny_config(), workdir)["status"] == "completed"


def test_an_ensemble_takes_each_members_lock(held, tmp_path):
    workdir, process = held
    other = tmp_path / "other"
    configs = [tiny_config(**{"train.seed": 0}), tiny_config(**{"train.seed": 1})]
    with pytest.raises(locking.DirectoryBusyError, match=f"PID {process.pid}"):
        train.train_runs(configs, [other, workdir])
    assert not other.exists()  # the lock taken on the first member was given back, and its
    # directory, created for the lock only, removed


# ------------------------------------------------ 4. verified checkpoints


def largest_file(directory: pathlib.Path) -> pathlib.Path:
    files = [p for p in directory.rglob("*") if p.is_file() and p.name != checkpoints.DIGEST_NAME]
    return max(files, key=lambda p: p.stat().st_size)


def flip_a_bit(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: pathlib.Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def remove_metadata(step_dir: pathlib.Path) -> None:
    (step_dir / "default" / "_METADATA").unlink()  # orbax's description of the saved tree


DAMAGE = {
    "flipped bit": lambda step_dir: flip_a_bit(largest_file(step_dir)),
    "truncated file": lambda step_dir: truncate(largest_file(step_dir)),
    "removed metadata": remove_metadata,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, uninterrupted,
                                                             capfd):
    workdir = tmp_path / "run"
    assert stopped_at(workdir, 7)["status"] == "preempted"  # checkpoints 5 and 7
    DAMAGE[damage](workdir / "checkpoints" / "7")
    summary = train.train(tiny_config(), workdir)
    warnings = [line for line in capfd.readouterr().err.splitlines() if "damaged" in line]
    assert len(warnings) == 1 and "step 7" in warnings[0] and "resuming from step 5" in warnings[0]
    reference_summary, reference_rows = uninterrupted
    assert results(summary) == results(reference_summary)
    assert metric_rows(workdir) == reference_rows
    assert (workdir / "damaged_checkpoints" / "7").is_dir()


def test_an_ensemble_member_that_lost_its_latest_checkpoint_trains_alone(tmp_path, uninterrupted):
    """Two members stopped together at 7 group as one ensemble (by their latest checkpoints);
    one's checkpoint 7 is damaged, so it restores 5 and the two cannot step as one program.
    The sweep trains them one by one, and the damaged one ends where it would have."""
    configs = [tiny_config(), tiny_config(**{"train.seed": 1})]
    workdirs = [tmp_path / "a", tmp_path / "b"]
    (stop,) = hooks.hooks_from_environment({hooks.SIGNAL_AT_ENV: "7:SIGTERM"})
    stopped = train.train_runs(configs, workdirs, extra_hooks=[stop])
    assert [s["status"] for s in stopped] == ["preempted", "preempted"]
    DAMAGE["flipped bit"](workdirs[0] / "checkpoints" / "7")
    assert ensemble.group(configs, workdirs) == [[0, 1]]
    points = [sweep.Point(w.name, {}, c) for w, c in zip(workdirs, configs, strict=True)]
    assert sweep._train_together(str(tmp_path), points, ()) == ["completed", "completed"]
    # Steps 1-7 ran as an ensemble member and 6-10 alone: equal to float32 round-off.
    reference = results(uninterrupted[0])
    assert results(read_json(workdirs[0] / "summary.json")) == pytest.approx(reference, rel=1e-5)


def test_no_intact_checkpoint_is_one_line_naming_the_step(tmp_path):
    workdir = tmp_path / "run"
    stopped_at(workdir, 7)
    for step in (5, 7):
        flip_a_bit(largest_file(workdir / "checkpoints" / str(step)))
    before = snapshot(workdir)
    line = one_error_line(run_module("main", *main_args(workdir)))
    assert "no intact checkpoint" in line and "step 7" in line and "aside" in line
    assert snapshot(workdir) == before


# ------------------------------------------------ 3. honest exit codes from a sweep


EXPERIMENT = textwrap.dedent('''
    from experiments import base

    def get_config(arg=None):
        config = base.get_config("quick")
        for name, value in {tiny!r}.items():
            section, field = name.split(".")
            config[section][field] = value
        config.wandb.mode = "offline"
        return config

    def sweep(arg=None):
        return [{{"train.seed": 0}}, {{"train.seed": 1, "data.source": "text:no_such_file.txt"}}]

    def claims(arg=None):
        from scale_ablation.analysis import claims as claims_lib
        return [claims_lib.Claim("1/sqrt(d_k) trains",
                                 claims_lib.Unstable(("inv_sqrt_dk",), expect_unstable=False))]
''')


def test_a_sweep_with_a_failed_run_exits_4_and_reports_it_first(tmp_path):
    experiment_file = tmp_path / "tiny_experiment.py"
    experiment_file.write_text(EXPERIMENT.format(tiny={**TINY, "wandb.mode": "offline"}))
    sweep_dir = tmp_path / "sweep"
    result = run_module("sweep", f"--config={experiment_file}", f"--workdir={sweep_dir}")
    assert result.returncode == sweep.EXIT_INCOMPLETE, result.stdout + result.stderr
    failed = [entry["name"] for entry in read_json(sweep_dir / "sweep.json")["runs"]
              if entry["status"] != "completed"]
    assert len(failed) == 1 and "no_such_file" in failed[0]
    assert f"{failed[0]} (failed)" in result.stdout
    # After the noise-floor line (when the sweep has one), before any table.
    first_lines = (sweep_dir / "report" / "summary.md").read_text().splitlines()[:6]
    assert any(failed[0] in line and "failed" in line for line in first_lines)
    # The verdicts say they rest on part of the grid, counted as sweep.json counts it.
    claims_md = (sweep_dir / "report" / "claims.md").read_text()
    total = len(read_json(sweep_dir / "sweep.json")["runs"])
    assert claims_md.startswith(f"**{total - len(failed)} of {total} runs finished**")


def test_a_second_sweep_on_one_directory_is_refused(tmp_path):
    sweep_dir = tmp_path / "sweep"
    lock = locking.DirectoryLock(sweep_dir).acquire()
    try:
        before = snapshot(sweep_dir)
        experiment_file = tmp_path / "tiny_experiment.py"
        experiment_file.write_text(EXPERIMENT.format(tiny=TINY))
        line = one_error_line(run_module("sweep", f"--config={experiment_file}",
                                         f"--workdir={sweep_dir}"))
        assert f"PID {os.getpid()}" in line
        assert snapshot(sweep_dir) == before
    finally:
        lock.release()


# ------------------------------------------------ 6. W&B unreachable


def test_an_unreachable_wandb_server_turns_later_runs_offline(tmp_path, monkeypatch, caplog):
    from scale_ablation.records import wandb_tracker

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(wandb_tracker, "_UNREACHABLE", {})
    settings = wandb_tracker.WandbSettings(mode="online", init_timeout=2.0)
    trackers = []
    for name in ("first", "second"):
        tracker = wandb_tracker.WandbTracker(tmp_path / name, {}, settings)
        assert tracker.active and tracker.run_dir.name.startswith("offline-run-")
        tracker.finish()
        trackers.append(tracker)
    messages = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(messages) == 2
    assert "within 2 s" in messages[0] and "earlier in this process" in messages[1]
    assert all("wandb sync" in message for message in messages)


# ------------------------------------------------ 7. bad input and full disks


BAD = {
    "workdir is a file": ({}, "is a file"),
    "inv_log_dk at head_dim=1": ({"policy": "inv_log_dk", "model.head_dim": 1}, "d_k=1"),
    "wandb.mode=onlin": ({"wandb.mode": "onlin"}, "wandb.mode"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, case):
    overrides, expected = BAD[case]
    workdir = tmp_path / "run"
    if case == "workdir is a file":
        workdir.write_text("not a directory")
    before = snapshot(tmp_path)
    line = one_error_line(run_module("main", *main_args(workdir, **overrides), env=OWN_CACHE))
    assert expected in line
    assert snapshot(tmp_path) == before  # no .jax_cache beside it, no workdir


def test_validate_names_inv_log_dk_at_head_dim_1():
    with pytest.raises(ConfigError):
        validate(tiny_config(**{"policy": "inv_log_dk", "model.head_dim": 1}))


def test_a_garbage_summary_is_named_by_run_sweep_and_report(tmp_path):
    workdir = tmp_path / "sweep" / "run"
    train.train(tiny_config(), workdir)
    (workdir / "summary.json").write_text("{garbage")
    with pytest.raises(ConfigError, match=re.escape(str(workdir / "summary.json"))):
        train.train(tiny_config(), workdir)
    result = run_module("report", str(tmp_path / "sweep"))
    assert str(workdir / "summary.json") in one_error_line(result)
    with pytest.raises(ValueError, match=re.escape(str(workdir / "summary.json"))):
        report.write_report(str(tmp_path / "sweep"))


def test_a_full_disk_records_failed_and_the_rerun_matches(tmp_path, monkeypatch, uninterrupted):
    workdir = tmp_path / "run"
    append = RunFiles.append_metrics

    def full_disk_at_step_6(self, step, metrics):
        if step == 6:
            tmp = self.workdir / f".summary.json.tmp{os.getpid() + 1}"
            tmp.write_text("")  # what a write killed by ENOSPC leaves behind
            raise OSError(errno.ENOSPC, "No space left on device", str(self.metrics_path))
        append(self, step, metrics)

    monkeypatch.setattr(RunFiles, "append_metrics", full_disk_at_step_6)
    with pytest.raises(OSError) as raised:
        train.train(tiny_config(), workdir)
    assert raised.value.errno == errno.ENOSPC
    assert read_json(workdir / "summary.json")["status"] == "failed"
    monkeypatch.undo()
    summary = train.train(tiny_config(), workdir)
    reference_summary, reference_rows = uninterrupted
    assert results(summary) == results(reference_summary)
    assert metric_rows(workdir) == reference_rows
    assert not list(workdir.glob(".*.tmp*"))
