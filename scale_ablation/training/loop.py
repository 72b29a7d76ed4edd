"""The training loop: K >= 1 runs stepped as one program, with hooks for everything periodic.

A single run is an ensemble of one. Each member keeps its own run directory, trackers,
checkpoints and summary; the loop steps their states together (`ensemble.MemberAxis`), checks
each for divergence, runs each member's hooks, and handles preemption (SIGTERM/SIGINT) for all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from scale_ablation.analysis import baselines, failures
from scale_ablation.records.run_files import STEP_LOSSES_FILE, SUMMARY_FIELDS, StepLosses
from scale_ablation.records.tracking import RunTrackers, open_trackers
from scale_ablation.records.wandb_tracker import WandbSettings
from scale_ablation.training import provenance, runtime
from scale_ablation.training.ensemble import MemberAxis
from scale_ablation.training.evaluation import Evaluator
from scale_ablation.training.optim import lr_multiplier_program
from scale_ablation.training.preemption import PreemptionFlag
from scale_ablation.training.run_setup import PreparedRun
from scale_ablation.training.steps import TrainState


@dataclasses.dataclass
class Tick:
    """What a hook sees after a step."""

    step: int  # steps done: the step the row is logged at
    last: bool  # the run's final step
    metrics: dict[str, float]  # this step's train metrics (train/loss, train/grad_norm, ...)
    step_seconds: float  # wall time of the whole (ensemble) step (a chunk's share of its time)
    state: Callable[[], TrainState]  # the member's state after the step, cut at most once
    # The state at the end of the step's program: a non-finite step and the rest of its chunk
    # leave the state as it was, so after a divergence this is the last good state, even when
    # the step is inside a chunk (where `state` cannot be read).
    end_state: Callable[[], TrainState] | None = None
    timed: bool = True  # False in a process's first program, whose time includes compilation
    row: dict[str, float] = dataclasses.field(default_factory=dict)


Action = Callable[["Member", Tick], None]  # a hook: see scale_ablation.training.hooks


@dataclasses.dataclass(frozen=True)
class Periodic:
    """Run `action` every `every` steps (never when 0), and at the last step if `at_last`.
    `after_step_work`: run after the step's row is written and its checkpoint saved, rather
    than before the row (where a hook adds to it)."""

    every: int
    action: Action
    at_last: bool = True
    after_step_work: bool = False
    reads_state: bool = True  # False: never calls tick.state(), so it can run inside a chunk

    def due(self, tick: Tick) -> bool:
        return self.due_at(tick.step, tick.last)

    def due_at(self, step: int, last: bool) -> bool:
        return bool(self.every) and (step % self.every == 0 or (self.at_last and last))


@dataclasses.dataclass
class Clock:
    """Training time of this attempt; a process's first step (compilation) is not counted."""

    tokens_per_step: int
    wall_before: float  # wall seconds of earlier attempts (resumed runs)
    started: float = dataclasses.field(default_factory=time.perf_counter)
    steps: int = 0
    seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.steps, self.seconds = self.steps + 1, self.seconds + seconds

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens_per_step * self.steps / self.seconds if self.seconds else None

    @property
    def wall_seconds(self) -> float:
        return self.wall_before + time.perf_counter() - self.started


def run_wandb_settings(run: PreparedRun) -> WandbSettings:
    """The config's `wandb` section, with tags for policy and d_k and, unless set, the run
    directory's name as the W&B run name (a sweep names its directories after their settings)."""
    config = run.config
    tags = (*config.wandb.tags, f"policy={config.policy}", f"d_k={config.model.head_dim}")
    name = config.wandb.get("name") or os.path.basename(os.path.abspath(run.workdir))
    return WandbSettings.of(config.wandb.to_dict(), tags=tags, name=name)


class Member:
    """One run in the loop: trackers, evaluator, clock, hooks, and its summary once finished."""

    def __init__(self, run: PreparedRun, label: str, hooks: Sequence[Periodic],
                 environment: dict):
        self.run, self.config, self.label, self.hooks = run, run.config, label, list(hooks)
        # Read before training starts: a checkout that changes while the run trains (a resumed
        # study, say) must not relabel the code that ran.
        self.environment = environment
        self.checkpoints = run.checkpoints
        self.evaluator = Evaluator(run)
        self.schedule = lr_multiplier_program(run.optimizer)
        self.tokens_per_step = self.config.train.batch_size * self.config.data.seq_len
        self.start_step = int(run.state["step"])
        self.clock = Clock(self.tokens_per_step, (run.previous or {}).get("wall_seconds") or 0.0)
        self.summary: dict | None = None
        self.summary_fields: dict = {}  # what hooks found, added to summary.json at the end
        self.parameter_counts = provenance.parameter_counts(run.state["params"])
        self.train_tokens = provenance.train_tokens(run.source)
        self._warn_if_repeated()
        self._warn_if_small_test()
        self.trackers: RunTrackers = open_trackers(
            run.workdir, self.config.to_dict(),
            wandb=run_wandb_settings(run),
            resume_step=run.resume_step, enable=jax.process_index() == 0)
        self.last = {"train/loss": self._logged_train_loss(), "val/loss": None, "val/bpb": None}
        self.step_losses = StepLosses(  # every step's, which the spike rule judges
            os.path.join(run.workdir, STEP_LOSSES_FILE) if self.trackers.files is not None
            else None,
            run.resume_step)
        self.test: dict[str, float] = {}  # the test split's scores, once the run has ended

    def _warn_if_repeated(self) -> None:
        """One line when the planned steps read the training split more than once: the final
        loss then measures memorisation too, and memorisation grows with parameters."""
        planned = provenance.consumption(self.config, self.parameter_counts,
                                         self.config.train.steps, self.train_tokens,
                                         self.run.model)
        if (planned["passes_over_data"] or 0) > 1:
            print(f"{self.label}warning: {planned['tokens_seen']:,} training tokens are "
                  f"{planned['passes_over_data']:.1f} passes over the {self.train_tokens:,}-token "
                  "training split: the data repeats", flush=True)

    def _warn_if_small_test(self) -> None:
        """One line when the held-out text holds fewer test windows than `data.test_bytes` asks
        for: the test set is then smaller, and its sampling error larger, than planned."""
        asked, got = self.evaluator.test_windows_asked, self.evaluator.test_windows
        if got < asked:
            seq_len = self.config.data.seq_len
            print(f"{self.label}warning: data.test_bytes={self.config.data.test_bytes:,} asks for "
                  f"{asked:,} test windows of {seq_len + 1} bytes; the held-out text holds "
                  f"{got:,} outside the validation windows, so the test set scores "
                  f"{got * seq_len:,} bytes", flush=True)

    def _logged_train_loss(self) -> float | None:
        """A resumed run's train loss at its checkpoint, as logged then (None if not logged)."""
        files = self.trackers.files
        rows = files.read_metrics() if files is not None and self.start_step else []
        return next((r.get("train/loss") for r in rows if r["step"] == self.start_step), None)

    def evaluate(self, state: TrainState) -> dict[str, float]:
        row = self.evaluator.evaluate(state)
        self.last.update({"val/loss": row["val/loss"], "val/bpb": row["val/bpb"]})
        return row

    def evaluate_test(self, state: TrainState) -> dict[str, float]:
        """The test split's scores (once, at the end; `evaluation.Evaluator.evaluate_test`) and
        the seconds they took (`perf/test_seconds`)."""
        started = time.perf_counter()
        self.test = self.evaluator.evaluate_test(state)
        if not self.test:
            return {}
        return {**self.test, "perf/test_seconds": time.perf_counter() - started}

    def begin(self, state: TrainState) -> None:
        """Step 0: the model at initialisation, the reference for LR sensitivity and for how
        far training moves the attention statistics."""
        t = self.config.train
        if self.start_step == 0 and (t.eval_every or t.diag_every):
            self.trackers.log(0, {**(self.evaluate(state) if t.eval_every else {}),
                                  **(self.evaluator.diagnose(state) if t.diag_every else {})})

    def after_step(self, tick: Tick) -> None:
        """Divergence check, then the due hooks. Sets `summary` if the run diverged."""
        if tick.timed:
            self.clock.add(tick.step_seconds)
        self.step_losses.add(tick.step, tick.metrics["train/loss"])
        if not tick.metrics.pop("train/finite"):
            self.trackers.log(tick.step, {**tick.metrics, "train/diverged": 1.0})
            print(f"{self.label}step {tick.step}: non-finite loss or gradient norm, "
                  "run diverged", flush=True)
            if tick.end_state is not None:  # what `python -m scale_ablation.nonfinite` replays
                self.checkpoints.save(tick.step - 1, tick.end_state())
            self.finish("diverged", tick.step - 1, diverged_at_step=tick.step)
            return
        self.last["train/loss"] = tick.metrics["train/loss"]
        for hook in self.hooks:
            if hook.due(tick):
                hook.action(self, tick)

    def preempt(self, step: int, state: TrainState, signum: int) -> None:
        """Checkpoint `state` (before `step`) and record the run as preempted."""
        self.checkpoints.save(step, state)
        self.finish("preempted", step, signal=signal.Signals(signum).name)

    def complete(self, state: TrainState) -> None:
        steps = self.config.train.steps
        if self.start_step >= steps:  # killed after the final checkpoint, before summary.json
            self.evaluate(state)
            self.evaluate_test(state)
            self.summary_fields.update(self._failures_of_logged_rows())
        self.checkpoints.save(steps, state)
        self.finish("completed", steps)

    def _failures_of_logged_rows(self) -> dict:
        """What `hooks.watch_failures` adds to the summary at the last step, from the rows on
        disk: a run resumed from its final checkpoint runs no step, so no hook sees it."""
        files = self.trackers.files
        if files is None:  # not the process that writes the run files
            return {}
        found = baselines.baselines(self.config.to_dict())
        unigram, bigram = (baselines.bits_to_nats(found[key]) if key in found else None
                           for key in ("unigram_bpb", "bigram_bpb"))
        rows, warmup = files.read_metrics(), self.config.train.warmup_steps
        losses = self.step_losses.complete()
        return {**failures.failure_steps(rows, warmup_steps=warmup, unigram_loss=unigram,
                                         step_losses=losses),
                "failures": failures.classify(rows, warmup_steps=warmup, unigram_loss=unigram,
                                              bigram_loss=bigram, step_losses=losses)}

    def finish(self, status: str, step: int, **extra) -> None:
        """Write the summary and close the member's trackers and checkpoints."""
        self.step_losses.write()
        self.checkpoints.drop_older_when_finished(status, self.config.checkpoint, self.label)
        summary = {
            "status": status,
            "steps_completed": step,
            "final_train_loss": self.last["train/loss"],
            "final_val_loss": self.last["val/loss"],
            "final_val_bpb": self.last["val/bpb"],
            # The test split reports (a completed run's final state); validation chose.
            **{f"test_{key}": self.test.get(f"test/{key}")
               for key in ("loss", "bpb", "accuracy", "targets")},
            "diverged_at_step": None,
            "wall_seconds": self.clock.wall_seconds,
            "tokens_per_second": self.clock.tokens_per_second,
            **self.summary_fields,
            **failures.summary_spike(self.step_losses.complete(),
                                     warmup_steps=self.config.train.warmup_steps),
            **provenance.consumption(self.config, self.parameter_counts, step, self.train_tokens,
                                     self.run.model),
            "environment": self.environment,
            **extra,
        }
        self._close(summary)
        self.checkpoints.remove_when_finished(status, self.config.checkpoint, self.label)

    def fail(self, error: Exception) -> None:
        """summary.json says `failed` and why."""
        self._close({"status": "failed", "error": f"{type(error).__name__}: {error}"})

    def _close(self, summary: dict) -> None:
        self.trackers.summary(summary)
        # Field for field what summary.json holds, so that rerunning a finished run (which
        # returns summary.json) gives back an equal dict.
        self.summary = {**dict.fromkeys(SUMMARY_FIELDS), **summary,
                        "wandb_run_id": self.trackers.wandb_run_id}
        self.trackers.finish(exit_code=1 if summary["status"] == "failed" else 0)
        self.checkpoints.close()


def run_members(members: Sequence[Member], *, pipelined: bool = True) -> None:
    """Train the members (prepared to start from one step) to their end; each ends with a
    summary. On an exception, members without one are recorded failed, and it is re-raised.

    `pipelined`: step N+1 is dispatched before step N's metrics are read, so the host never
    waits on the device between steps (rows, divergence, preemption and the final state are
    the same as without; states are then not donated). False: each step's metrics are read
    before the next is dispatched, and the state is donated to the next step.
    """
    try:
        _loop(list(members), pipelined)
    except Exception as error:
        for member in members:
            if member.summary is None:
                # On a full disk the summary may not be writable either: record it where it is.
                with contextlib.suppress(OSError):
                    member.fail(error)
        raise


@dataclasses.dataclass
class _InFlight:
    """A dispatched step: its state and metrics (device arrays) and when it was dispatched."""

    step: int  # steps done once it finishes
    count: int  # steps in its program
    state: TrainState
    metrics: jax.Array  # (M,), or (K, M): steps.TRAIN_METRICS; (count, M), (K, count, M)
    dispatched: float


def _loop(members: list[Member], pipelined: bool) -> None:
    first = members[0]
    t = first.config.train
    axis = MemberAxis([m.run for m in members], donate=not pipelined)
    sources = [m.run.source for m in members]
    state = axis.stack([m.run.take_state() for m in members])
    for index, member in enumerate(members):
        member.begin(axis.member_state(state, index))
        member.summary_fields.update(ensemble=os.path.basename(os.path.abspath(first.run.workdir)),
                                     ensemble_members=len(members))
    active = list(range(len(members)))

    def dispatch(state: TrainState, step: int) -> _InFlight:
        dispatched = time.perf_counter()
        count = _chunk_length(members, step, t)
        new_state, metrics = axis.step(state, axis.batch(sources, step, count), count)
        return _InFlight(step + count, count, new_state, metrics, dispatched)

    with PreemptionFlag() as preemption:
        in_flight = None
        if first.start_step < t.steps:
            if _preempt(members, active, axis, first.start_step, state, preemption):
                return
            in_flight = dispatch(state, first.start_step)
        hooks_done, first_done = time.perf_counter(), False
        while in_flight is not None:
            done, in_flight = in_flight, None
            if pipelined and done.step < t.steps:
                in_flight = dispatch(done.state, done.step)  # runs while `done` is read
            metrics = jax.device_get(done.metrics)  # one transfer
            # Each member is charged the whole step: from its dispatch, or from the end of the
            # previous step's hooks when it was dispatched before them.
            seconds = time.perf_counter() - max(done.dispatched, hooks_done)
            state = done.state
            _after_steps(members, active, axis, done, metrics, seconds, t.steps,
                         timed=first_done)
            first_done, hooks_done = True, time.perf_counter()
            if not active or (done.step < t.steps and _preempt(
                    members, active, axis, done.step, state, preemption)):
                return
            if not pipelined and done.step < t.steps:
                in_flight = dispatch(state, done.step)
    for index in active:
        members[index].complete(axis.member_state(state, index))


def _chunk_length(members: list[Member], step: int, t) -> int:
    """How many steps the program dispatched at `step` runs: `train.steps_per_call` at most,
    a power of two (one compiled program each), and ending at or before the next step where a
    hook that reads the state is due (only the chunk's last state is kept) and the run's end."""
    limit = min(t.get("steps_per_call", 1), t.steps - step)
    for ahead in range(1, limit):  # the chunk's interior steps
        if any(hook.reads_state and hook.due_at(step + ahead, step + ahead == t.steps)
               for member in members for hook in member.hooks):
            limit = ahead
            break
    return 1 << (max(limit, 1).bit_length() - 1)


def _after_steps(members: list[Member], active: list[int], axis: MemberAxis, done: _InFlight,
                 metrics: np.ndarray, seconds: float, steps: int, timed: bool) -> None:
    """Each active member's divergence check and hooks for each step of `done`; a member that
    diverged leaves `active` (frozen by the step, its numbers no longer read). The state is
    that of the program's last step; `_chunk_length` ends a chunk where a hook reads one."""
    for offset in range(done.count):
        step = done.step - done.count + 1 + offset
        # (M,), or (K, M): this step's metrics
        step_metrics = metrics if done.count == 1 else metrics[..., offset, :]
        for index in list(active):
            end_state = functools.cache(functools.partial(axis.member_state, done.state, index))
            members[index].after_step(Tick(
                step=step, last=step == steps, step_seconds=seconds / done.count,
                metrics=axis.member_metrics(step_metrics, index), timed=timed,
                state=end_state if step == done.step else _interior_state,
                end_state=end_state))
            if members[index].summary is not None:
                active.remove(index)


def _interior_state() -> TrainState:
    raise RuntimeError("a hook read the state of a step inside a chunk of steps: mark it "
                       "reads_state=True (the default) so that chunks end at its steps")


def _preempt(members: list[Member], active: list[int], axis: MemberAxis, step: int,
             state: TrainState, preemption: PreemptionFlag) -> bool:
    """If a preemption signal came (to any process: `runtime.agreed_signal`, so that every
    process stops at the same step), checkpoint the active members at `step` and say so."""
    if (signum := runtime.agreed_signal(preemption.signal)) is None:
        return False
    for index in active:
        members[index].preempt(step, axis.member_state(state, index), signum)
    return True
