"""The sweep's closing lines: the report written, or one line saying why there is none, and
each claim's computed verdict. The report's functions come from the `report` command, which
this library module does not import (a command defines flags on import)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from scale_ablation.sweeping import run_set

WriteReport = Callable[[str], str]  # sweep directory -> the report's folder
VerdictLines = Callable[[str], list[str]]  # the report's folder -> a line per claim


def write_report(sweep_dir: str, write: WriteReport, verdict_lines: VerdictLines) -> bool:
    """The report, or one line saying why there is none (then the sweep is incomplete: a
    report left by an earlier invocation is not this one's)."""
    stale = os.path.join(sweep_dir, "report")
    stale = stale if os.path.isdir(stale) else None
    try:
        print_verdicts(write(sweep_dir), verdict_lines)
        return True
    except ValueError as error:  # no run wrote its config, or a run's files are damaged
        reason = str(error)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        reason = f"no space left on device ({error.filename or sweep_dir})"
    print(f"[sweep] no report: {reason}" + (f" ({stale} is from an earlier invocation)"
                                            if stale else ""), flush=True)
    return False


def print_verdicts(out: str, verdict_lines: VerdictLines) -> None:
    """The closing lines: where the report is, and each claim's computed verdict with what the
    sweep's design cannot support (claims.md says it at the head of every verdict)."""
    lines = [f"[sweep] {line}" for line in verdict_lines(out)]
    path = os.path.join(out, "claims.md")
    count = run_set.of(os.path.dirname(out)).count_line()  # the verdicts rest on these alone
    print("\n".join([*lines, f"[sweep] {count}: " * bool(count) + f"report: {out}/summary.md"
                     + (f", {path}" if lines else "")]), flush=True)
