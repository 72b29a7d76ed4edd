"""What a sweep prints: a status line when runs start or end, one line per finished run with its
numbers, and the current group's step progress, live on a terminal and every `interval` seconds
as plain lines elsewhere (Slurm logs, files)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from scale_ablation.training.loop import Member, Periodic, Tick


class Progress:
    """Runs done / running / failed and an ETA from the runs finished in this invocation."""

    def __init__(self, total: int, already_done: int, stream: TextIO | None = None,
                 interval: float = 10.0):
        self.total, self.done, self.started = total, already_done, time.perf_counter()
        self.fresh_done = 0
        self.counts: dict[str, int] = {}
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()  # a terminal: rewrite one line instead of adding lines
        self.interval = interval

    def _print(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\033[K")  # clear the live step line first
        print(text, file=self.stream, flush=True)

    def finished(self, status: str, name: str = "", summary: dict | None = None) -> None:
        self.done += 1
        self.fresh_done += 1
        self.counts[status] = self.counts.get(status, 0) + 1
        if name:
            self._print(f"[sweep] {name}: {status}{_numbers(summary or {})}")

    def show(self, running: int) -> None:
        elapsed = time.perf_counter() - self.started
        left = self.total - self.done
        eta = f"{elapsed / self.fresh_done * left:.0f}s" if self.fresh_done else "?"
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        self._print(f"[sweep] {self.done}/{self.total} done, {running} running, "
                    f"{self.counts.get('failed', 0)} failed ({counts}), eta {eta}")

    def step_hook(self, label: str) -> Periodic:
        """A hook for the runs of one group: their shared step, tokens per second and ETA, at
        its first and last step and at most every `interval` seconds between (on a terminal:
        every step, on one rewritten line)."""

        # This group's last line: time and step (its members share the step: one line each).
        last_line = {"time": -float("inf"), "step": -1}

        def report(member: Member, tick: Tick) -> None:
            now = time.perf_counter()
            if tick.step == last_line["step"] or (
                    not self.live and now - last_line["time"] < self.interval and not tick.last):
                return
            last_line.update(time=now, step=tick.step)
            clock, total = member.clock, member.config.train.steps
            rate = f"{clock.tokens_per_second:,.0f} tok/s" if clock.tokens_per_second else "-"
            eta = (f"{(total - tick.step) * clock.seconds / clock.steps:.0f}s"
                   if clock.steps else "?")
            text = f"[sweep] {label}: step {tick.step}/{total}, {rate}, eta {eta}"
            if self.live:
                self.stream.write("\r\033[K" + text)
                self.stream.flush()
            else:
                print(text, file=self.stream, flush=True)

        return Periodic(1, report, after_step_work=True, reads_state=False)


def _numbers(summary: dict) -> str:
    """`, val bpb 3.812, 120 steps, 14 s` from a run's summary (what it has of it)."""
    parts = []
    if summary.get("final_val_bpb") is not None:
        parts.append(f"val bpb {summary['final_val_bpb']:.4f}")
    if summary.get("steps_completed") is not None:
        parts.append(f"{summary['steps_completed']} steps")
    if summary.get("wall_seconds") is not None:
        parts.append(f"{summary['wall_seconds']:.0f} s")
    return (", " + ", ".join(parts)) if parts else ""
