"""Periodic work around the train step, as a list of hooks (in the spirit of clu's periodic
actions): each is a function of (member, tick) and how often it runs.

After every step, for each member that did not diverge, the loop calls the due hooks in list
order. Hooks before `write_row` (the built-in ones, then a run's extra hooks) add to `tick.row`,
which `write_row` logs as one row at that step; hooks after it see the row as logged. With
`train.steps_per_call` > 1 the loop runs several steps per program and keeps only the last
state: a chunk ends at every step where a hook that reads the state (`tick.state()`, the
default `reads_state=True`) is due. Adding periodic work is one function and one line:

    def count_tokens(member, tick):
        tick.row["tokens"] = tick.step * member.tokens_per_step

    train.train(config, workdir, extra_hooks=[hooks.Periodic(100, count_tokens)])
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Sequence

import ml_collections

from scale_ablation.analysis import baselines, failures
from scale_ablation.training.loop import Member, Periodic, Tick
from scale_ablation.training.loss_scaling import LossScaling


def log_train_metrics(member: Member, tick: Tick) -> None:
    row = tick.row
    row.update(tick.metrics)
    row["train/bpb"] = row["train/loss"] / math.log(2)
    row["train/lr"] = float(member.config.train.lr * member.schedule(tick.step - 1))
    row["perf/step_seconds"] = tick.step_seconds
    if member.clock.tokens_per_second is not None:
        row["perf/tokens_per_second"] = member.clock.tokens_per_second


def evaluate(member: Member, tick: Tick) -> None:
    tick.row.update(member.evaluate(tick.state()))


def evaluate_test(member: Member, tick: Tick) -> None:
    """The test split, once, at the run's last step (validation chooses, the test reports)."""
    tick.row.update(member.evaluate_test(tick.state()))


def diagnose(member: Member, tick: Tick) -> None:
    tick.row.update(member.evaluator.diagnose(tick.state()))


def _watched(row: dict) -> dict:
    """The parts of a row the failure rules read: losses and normalised attention entropies."""
    return {k: v for k, v in row.items()
            if k in ("train/loss", "val/loss") or k.endswith("entropy_normalised")}


def watch_failures(config: ml_collections.ConfigDict) -> Periodic:
    """The failure taxonomy (`analysis.failures`) applied to the rows as they are logged: the
    first step of a spike, an entropy collapse and a collapse go into summary.json and W&B as
    soon as they are seen (the row gets `train/spiked`, `attn/entropy_collapsed` or
    `val/collapsed`), and at the last step the run's failure kinds (`failures`, empty when it
    trains smoothly) join its summary. Spikes are judged on every step's loss
    (`Member.step_losses`) when the run has them all, else on the logged rows; the summary's
    `spike_step` is judged once more on the whole series when the run ends (`Member.finish`)."""
    base = baselines.baselines(config.to_dict())
    unigram = baselines.bits_to_nats(base["unigram_bpb"]) if "unigram_bpb" in base else None
    bigram = baselines.bits_to_nats(base["bigram_bpb"]) if "bigram_bpb" in base else None
    warmup = config.train.warmup_steps
    marks = (("spike_step", "train/spiked"), ("entropy_collapse_step", "attn/entropy_collapsed"),
             ("collapse_step", "val/collapsed"))
    rows: list[dict] = []

    def watch(member: Member, tick: Tick) -> None:
        if not rows and member.start_step and member.trackers.files is not None:
            rows.extend(_watched(r) | {"step": r["step"]}
                        for r in member.trackers.files.read_metrics())  # a resumed run's
        if watched := _watched(tick.row):
            rows.append({"step": tick.step, **watched})
            found = failures.failure_steps(rows, warmup_steps=warmup, unigram_loss=unigram,
                                           step_losses=member.step_losses.complete())
            for field, metric in marks:
                if found[field] is not None and member.summary_fields.get(field) is None:
                    member.summary_fields[field] = found[field]
                    tick.row[metric] = 1.0
        if tick.last:
            member.summary_fields["failures"] = failures.classify(
                rows, warmup_steps=warmup, unigram_loss=unigram, bigram_loss=bigram,
                step_losses=member.step_losses.complete())

    return Periodic(1, watch, reads_state=False)


def count_skipped_steps(config: ml_collections.ConfigDict) -> Periodic | None:
    """Under a dynamic loss scale, the steps it skipped (`training.loss_scaling`: a finite loss
    whose gradient overflowed), counted at every step: how often the scale acted by backing off
    (issue 54). The count so far goes into the rows at log and checkpoint steps
    (`train/skipped_steps`), so that a run resumed from a checkpoint goes on from it, and into
    summary.json (`skipped_steps`). None without a dynamic scale (nothing to skip)."""
    if not LossScaling.of(config.train).dynamic:
        return None
    every = (config.train.log_every, config.checkpoint.every)
    count: list[int] = []

    def counted(member: Member, tick: Tick) -> None:
        if not count:
            count.append(_resumed_skips(member))
        # A healthy step with a non-finite gradient norm is a skipped one (the loop has stopped
        # the run at any other non-finite step).
        count[0] += not math.isfinite(tick.metrics["train/grad_norm"])
        if tick.last or any(n and tick.step % n == 0 for n in every):
            tick.row["train/skipped_steps"] = count[0]
            member.summary_fields["skipped_steps"] = count[0]

    return Periodic(1, counted, reads_state=False)


def _resumed_skips(member: Member) -> int:
    """The skipped steps a resumed run had counted by its checkpoint (0 for a new run)."""
    files = member.trackers.files
    if not member.start_step or files is None:
        return 0
    logged = [r["train/skipped_steps"] for r in files.read_metrics()
              if r["step"] <= member.start_step and r.get("train/skipped_steps") is not None]
    return int(logged[-1]) if logged else 0


def write_row(member: Member, tick: Tick) -> None:
    if tick.row:
        member.trackers.log(tick.step, tick.row)


def print_progress(member: Member, tick: Tick) -> None:
    clock, total = member.clock, member.config.train.steps
    seconds_per_step = clock.seconds / clock.steps if clock.steps else float("nan")
    text = (f"{member.label}step {tick.step}/{total}  "
            f"loss {tick.row.get('train/loss', float('nan')):.4g} nats/byte")
    if "val/loss" in tick.row:
        text += f"  val {tick.row['val/loss']:.4g} nats/byte"
    text += (f"  {member.tokens_per_step / seconds_per_step:,.0f} tok/s  "
             f"eta {(total - tick.step) * seconds_per_step:.0f}s")
    print(text, flush=True)


def write_step_losses(config: ml_collections.ConfigDict) -> Periodic:
    """Every step's loss (`Member.step_losses`) into train_losses.jsonl, one line per logged
    row and before each checkpoint (a run resumed from any checkpoint has every step before
    it), and at the end; `Member.finish` writes what a diverged or preempted run has left."""
    log_every, checkpoint_every = config.train.log_every, config.checkpoint.every

    def write(member: Member, tick: Tick) -> None:
        if tick.last or any(every and tick.step % every == 0
                            for every in (log_every, checkpoint_every)):
            member.step_losses.write()

    return Periodic(1, write, reads_state=False)


def save_checkpoint(member: Member, tick: Tick) -> None:
    member.checkpoints.save(tick.step, tick.state())


def default_hooks(config: ml_collections.ConfigDict, extra: Sequence[Periodic] = (),
                  progress: bool = True) -> list[Periodic]:
    """What every run does: log, evaluate (always at the end: the summary needs it), diagnose,
    watch for failures, count a dynamic loss scale's skipped steps, then the `extra` hooks,
    then write the row, print progress, write every step's loss, checkpoint, and last the extra
    hooks marked `after_step_work`."""
    t = config.train
    return [
        Periodic(t.log_every, log_train_metrics, reads_state=False),
        Periodic(t.eval_every or t.steps, evaluate),
        Periodic(t.steps, evaluate_test),  # due at the last step only
        Periodic(t.diag_every, diagnose),
        watch_failures(config),
        *([skips] if (skips := count_skipped_steps(config)) else []),
        *(hook for hook in extra if not hook.after_step_work),
        Periodic(1, write_row, reads_state=False),
        Periodic(t.log_every if progress else 0, print_progress, at_last=False,
                 reads_state=False),
        write_step_losses(config),
        Periodic(config.checkpoint.every, save_checkpoint, at_last=False),
        *(hook for hook in extra if hook.after_step_work),
    ]


SIGNAL_AT_ENV = "SCALE_ABLATION_SIGNAL_AT"


def signal_at(spec: str) -> Periodic:
    """Fault injection for tests: `STEP[:SIGNAME]` sends this process SIGNAME (default SIGTERM)
    once step STEP is done (its row logged and its checkpoint, if due, written), so that a test
    stops a run at a chosen step instead of racing a signal against the clock."""
    step, _, name = spec.partition(":")
    try:
        signum = signal.Signals[name or "SIGTERM"]
        step_number = int(step)
    except (KeyError, ValueError):
        raise ValueError(f"{SIGNAL_AT_ENV}={spec!r}: expected STEP[:SIGNAME], "
                         "e.g. 40:SIGKILL") from None

    def send(member: Member, tick: Tick) -> None:
        if tick.step == step_number:
            os.kill(os.getpid(), signum)

    return Periodic(1, send, after_step_work=True)


def hooks_from_environment(environ: dict[str, str]) -> list[Periodic]:
    """The fault-injection hooks an environment asks for (none unless SIGNAL_AT_ENV is set)."""
    spec = environ.get(SIGNAL_AT_ENV, "")
    return [signal_at(spec)] if spec else []
