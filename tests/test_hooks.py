"""Hooks: periodic work added to a run with one function and one line, and the fault-injection
hook that stops a run at a chosen step."""

from types import SimpleNamespace

import pytest
from helpers import TINY_RUN as TINY
from helpers import read_json, tiny_config

from scale_ablation.analysis import baselines
from scale_ablation.records.run_files import RunFiles, StepLosses
from scale_ablation.training import hooks, train


def test_a_new_periodic_hook_is_one_function_and_one_line(tmp_path):
    calls = []

    def count_tokens(member, tick):  # the function
        calls.append(tick.step)
        tick.row["tokens"] = tick.step * member.tokens_per_step

    summary = train.train(tiny_config(), tmp_path / "run",
                          extra_hooks=[hooks.Periodic(3, count_tokens)])  # the line
    assert summary["status"] == "completed"
    assert summary["spike_step"] is None and summary["collapse_step"] is None  # a calm run
    assert calls == [3, 6, 9, 10]  # every 3 steps, and the last
    rows = {row["step"]: row for row in RunFiles(tmp_path / "run").read_metrics()}
    for step in calls:  # logged in that step's row, counted independently here
        assert rows[step]["tokens"] == step * TINY["train.batch_size"] * TINY["data.seq_len"]
    assert not any("tokens" in row for step, row in rows.items() if step not in calls)


def test_periodic_due_steps():
    hook = hooks.Periodic(4, lambda member, tick: None)
    ticks = [hooks.Tick(step=s, last=s == 10, metrics={}, step_seconds=0.0, state=dict)
             for s in range(1, 11)]
    assert [t.step for t in ticks if hook.due(t)] == [4, 8, 10]
    assert [t.step for t in ticks if hooks.Periodic(4, hook.action, at_last=False).due(t)] == [4, 8]
    assert not any(hooks.Periodic(0, hook.action).due(t) for t in ticks)


def test_signal_at_stops_a_run_at_the_chosen_step(tmp_path):
    (stop,) = hooks.hooks_from_environment({hooks.SIGNAL_AT_ENV: "6:SIGTERM"})
    summary = train.train(tiny_config(), tmp_path / "run", extra_hooks=[stop])
    assert summary["status"] == "preempted" and summary["signal"] == "SIGTERM"
    assert summary["steps_completed"] == 6
    assert read_json(tmp_path / "run" / "summary.json")["steps_completed"] == 6
    assert (tmp_path / "run" / "checkpoints" / "6").is_dir()
    # The signal comes after the step's work: its row (log_every 2) is on disk.
    assert [r["step"] for r in RunFiles(tmp_path / "run").read_metrics()] == [0, 2, 4, 5, 6]
    resumed = train.train(tiny_config(), tmp_path / "run")
    assert resumed["status"] == "completed" and resumed["steps_completed"] == 10


@pytest.mark.parametrize("spec", ["x", "3:SIGNOPE", "abc:SIGKILL"])
def test_signal_at_rejects_a_bad_spec(spec):
    with pytest.raises(ValueError, match=hooks.SIGNAL_AT_ENV):
        hooks.hooks_from_environment({hooks.SIGNAL_AT_ENV: spec})


def test_failures_are_watched_as_rows_are_logged():
    """The taxonomy's rules (`analysis.failures`) on rows as they arrive: a loss jump at step 14
    (a steady descent before it), the validation loss back at the unigram level at 18, and the
    run's failure kinds in its summary at the last step."""
    config = tiny_config(**{"train.warmup_steps": 2})
    watch = hooks.watch_failures(config)
    unigram_nats = baselines.bits_to_nats(baselines.baselines(config.to_dict())["unigram_bpb"])
    member = SimpleNamespace(summary_fields={}, start_step=0, trackers=SimpleNamespace(files=None),
                             step_losses=StepLosses(None, None))  # none: the rows are judged
    logged = {step: {"train/loss": 2.0 - 0.01 * step + 0.004 * (-1) ** (step // 2)}
              for step in range(2, 22, 2)}
    logged[14]["train/loss"] = 3.0
    logged[10]["val/loss"], logged[18]["val/loss"] = 1.9, unigram_nats + 0.1
    for step, row in logged.items():
        tick = hooks.Tick(step=step, last=step == 20, metrics={}, step_seconds=0.0, state=dict,
                          row=dict(row))
        watch.action(member, tick)
        assert tick.row.get("train/spiked") == (1.0 if step == 14 else None), step
        assert tick.row.get("val/collapsed") == (1.0 if step == 18 else None), step
    assert member.summary_fields == {"spike_step": 14, "collapse_step": 18,
                                     "failures": ["spiked", "not_learning", "collapsed"]}
