"""The pipelined loop (step N+1 dispatched before step N's metrics are read) against the loop
that reads every step's metrics first (`pipelined=False`, the loop as it was, donation
included): the same metrics.jsonl rows, summaries and final states, bit for bit, for a solo
run, an ensemble with a member that diverges, a solo run that diverges, and a preempted run.
Then several steps per program (`train.steps_per_call`) against one, bit for bit likewise.
"""

from __future__ import annotations

import io
import os
import signal
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from helpers import tiny_config

from scale_ablation.records.checkpoints import Checkpoints
from scale_ablation.records.run_files import RunFiles
from scale_ablation.sweeping import progress as console
from scale_ablation.training import hooks, loop, optim, preemption, run_setup, steps, train

# Dropout on, so that each step's key must be the same in both loops; no warmup or clipping,
# so that the diverging lr diverges within the run (tests/test_ensemble.py: step 4).
SHARED = {"model.attention_dropout": 0.1, "train.steps": 12, "train.warmup_steps": 0,
          "train.grad_clip": 0.0, "train.log_every": 1, "train.eval_every": 4,
          "train.diag_every": 6, "checkpoint.every": 6}
MEMBERS = {
    "none": {"policy": "none", "train.seed": 0, "train.lr": 3e-3},
    "const": {"policy": "const:0.3", "train.seed": 2, "train.lr": 5e-3},
    "diverging": {"policy": "inv_sqrt_dk", "train.seed": 3, "train.lr": 1e4},
}
TIMINGS = ("wall_seconds", "tokens_per_second", "environment")  # differ between any two runs


def config_of(name: str):
    return tiny_config(**SHARED, **MEMBERS[name])


def rows_of(workdir) -> list[dict]:
    """metrics.jsonl without its timings (perf/*)."""
    return [{k: v for k, v in row.items() if not k.startswith("perf/")}
            for row in RunFiles(workdir).read_metrics()]


def state_at(workdir, config, step: int) -> list[np.ndarray]:
    _, like = run_setup.init_state(config)
    checkpoints = Checkpoints(workdir)
    try:
        return [np.asarray(leaf) for leaf in jax.tree.leaves(checkpoints.restore(step, like))]
    finally:
        checkpoints.close()


def assert_same_run(got_dir, want_dir, config) -> None:
    """Rows, summary (but timings) and every saved checkpoint equal, bit for bit."""
    assert rows_of(got_dir) == rows_of(want_dir)
    got, want = RunFiles(got_dir).read_summary(), RunFiles(want_dir).read_summary()
    for field in TIMINGS:
        got.pop(field), want.pop(field)
    assert got == want
    saved = sorted(run_setup.checkpoint_steps(want_dir))
    assert sorted(run_setup.checkpoint_steps(got_dir)) == saved
    for step in saved:
        for a, b in zip(state_at(got_dir, config, step), state_at(want_dir, config, step),
                        strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def train_both(root, names: list[str], **kwargs) -> dict[bool, list[dict]]:
    """The runs `names` trained as one group, pipelined and not, under root/{on,off}/NAME."""
    return {pipelined: train.train_runs(
        [config_of(name) for name in names],
        [root / ("on" if pipelined else "off") / name for name in names],
        pipelined=pipelined, **kwargs) for pipelined in (True, False)}


def test_solo_run_is_the_same(tmp_path):
    summaries = train_both(tmp_path, ["const"])
    assert [s["status"] for s in summaries[True]] == ["completed"]
    assert_same_run(tmp_path / "on" / "const", tmp_path / "off" / "const", config_of("const"))


def test_ensemble_with_a_diverging_member_is_the_same(tmp_path):
    names = list(MEMBERS)
    summaries = train_both(tmp_path, names)
    statuses = {name: s["status"] for name, s in zip(names, summaries[True], strict=True)}
    assert statuses == {"none": "completed", "const": "completed", "diverging": "diverged"}
    assert 0 < summaries[True][2]["diverged_at_step"] < SHARED["train.steps"]
    for name in names:
        assert_same_run(tmp_path / "on" / name, tmp_path / "off" / name, config_of(name))


def test_solo_divergence_stops_at_the_same_step(tmp_path):
    summaries = train_both(tmp_path, ["diverging"])
    on, off = summaries[True][0], summaries[False][0]
    assert on["status"] == off["status"] == "diverged"
    assert on["diverged_at_step"] == off["diverged_at_step"]
    rows = RunFiles(tmp_path / "on" / "diverging").read_metrics()
    assert rows[-1]["step"] == on["diverged_at_step"] and rows[-1]["train/diverged"] == 1.0
    assert_same_run(tmp_path / "on" / "diverging", tmp_path / "off" / "diverging",
                    config_of("diverging"))


@pytest.mark.parametrize("at", [5, 6])  # between checkpoints, and at one
def test_preemption_stops_at_the_same_step(tmp_path, at):
    summaries = train_both(tmp_path, ["none"], extra_hooks=[hooks.signal_at(str(at))])
    for pipelined in (True, False):
        summary = summaries[pipelined][0]
        assert (summary["status"], summary["steps_completed"]) == ("preempted", at)
    assert_same_run(tmp_path / "on" / "none", tmp_path / "off" / "none", config_of("none"))


# --------------------------------------------------------------------------- chunks of steps

# Up to eight steps per program, where no hook reads the state: with a checkpoint at step 10
# and the final evaluation at 12, the 12 steps run as chunks of 8, 2 and 2, and the diverging
# member (step 4 alone: tests/test_ensemble.py) diverges inside the first.
LAYOUT = {"train.eval_every": 0, "train.diag_every": 0, "checkpoint.every": 10}


def train_chunked_and_not(root, names: list[str], layout: dict | None = None,
                          **kwargs) -> dict[bool, list[dict]]:
    """The runs `names` as one group with up to 8 steps per program and with 1, under
    root/{on,off}/NAME; `layout` overrides both."""
    return {chunked: train.train_runs(
        [tiny_config(**{**SHARED, **MEMBERS[name], **(layout or {}),
                        "train.steps_per_call": 8 if chunked else 1}) for name in names],
        [root / ("on" if chunked else "off") / name for name in names], **kwargs)
        for chunked in (True, False)}


def chunk_programs_compiled(name: str) -> int:
    config = config_of(name)
    graphdef, _ = run_setup.init_state(config)
    programs = steps.programs(graphdef, optim.OptimizerSettings.of(config),
                              float(config.train.z_loss))
    return sum(program._cache_size() for program in programs.chunks.values())


def test_chunks_of_steps_give_the_same_ensemble_run(tmp_path):
    names = list(MEMBERS)
    summaries = train_chunked_and_not(tmp_path, names, LAYOUT)
    assert chunk_programs_compiled("none") >= 2  # chunks of 8 and of 2 steps ran
    statuses = [s["status"] for s in summaries[True]]
    assert statuses == ["completed", "completed", "diverged"]
    assert summaries[True][2]["diverged_at_step"] == summaries[False][2]["diverged_at_step"]
    for name in names:
        assert_same_run(tmp_path / "on" / name, tmp_path / "off" / name, config_of(name))


def test_a_solo_run_diverging_inside_a_chunk_stops_at_its_step(tmp_path):
    summaries = train_chunked_and_not(tmp_path, ["diverging"], LAYOUT)
    on, off = summaries[True][0], summaries[False][0]
    assert on["status"] == off["status"] == "diverged"
    assert on["diverged_at_step"] == off["diverged_at_step"]
    assert on["diverged_at_step"] < 8  # inside the first chunk, not at its end
    assert_same_run(tmp_path / "on" / "diverging", tmp_path / "off" / "diverging",
                    config_of("diverging"))


def test_a_chunk_ends_where_a_hook_reads_the_state(tmp_path):
    seen = []

    def record(member, tick):
        seen.append((tick.step, int(tick.state()["step"])))

    summaries = train_chunked_and_not(tmp_path, ["none"],
                                      extra_hooks=[hooks.Periodic(3, record)])
    assert [s["status"] for s in summaries[True]] == ["completed"]
    want = [(step, step) for step in range(3, 13, 3)]
    assert seen == want + want  # chunked, then not: each state is its step's
    assert_same_run(tmp_path / "on" / "none", tmp_path / "off" / "none", config_of("none"))


def test_only_hooks_that_read_the_state_end_a_chunk():
    """The hooks every run and every sweep attach: with evaluation, diagnostics and checkpoints
    at step 16 only, a chunk from step 0 runs 8 steps, from 8 too, and from 12 the 4 to 16;
    a hook that reads the state every 3 steps cuts the chunk from 0 to 2 steps (3 is inside 0-4:
    the power of two below 3)."""
    config = tiny_config(**{"train.steps": 16, "train.steps_per_call": 8, "train.eval_every": 16,
                            "train.diag_every": 16, "checkpoint.every": 16})
    sweep_line = console.Progress(total=1, already_done=0, stream=io.StringIO()).step_hook("g")
    member = SimpleNamespace(hooks=[*hooks.default_hooks(config, extra=[sweep_line]),
                                    *hooks.hooks_from_environment({})])
    t = config.train
    assert [loop._chunk_length([member], step, t) for step in (0, 8, 12, 15)] == [8, 8, 4, 1]
    member.hooks.append(hooks.Periodic(3, lambda m, tick: tick.state()))
    assert loop._chunk_length([member], 0, t) == 2


def test_a_signal_caught_by_an_inner_flag_reaches_the_outer():
    """A sweep's flag around a group's: a signal the group's loop caught but did not act on
    (it came during the last step) is the sweep's once the loop's flag exits, and one the
    sweep caught before a group began is that group's from its start."""
    before = signal.getsignal(signal.SIGINT)
    with preemption.PreemptionFlag() as outer:
        with preemption.PreemptionFlag() as inner:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs between bytecodes of the main thread
            assert inner.signal == signal.SIGINT and outer.signal is None
        assert outer.signal == signal.SIGINT
        with preemption.PreemptionFlag() as later:
            assert later.signal == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before
