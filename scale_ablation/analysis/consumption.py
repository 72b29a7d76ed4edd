"""What a sweep consumed, from its runs' summary.json: tokens, train FLOPs and wall time.

Members of an ensemble share one loop, so each member's `wall_seconds` is the ensemble's
(`records.run_files.SUMMARY_FIELDS`): the sweep's wall time is the sum over its ensembles of
the longest member's (a member that stopped early stopped first), not a sum over runs. It is
machine time, the elapsed time only where ensembles ran one after another (no `--parallel`).
A member resumed in a smaller ensemble than it started in carries its earlier attempt's time,
which its first ensemble's longest member may carry too: such a sum can count that time twice.
"""

from __future__ import annotations

from collections.abc import Iterable


def wall_seconds(summaries: Iterable[dict]) -> tuple[float, int, int]:
    """(seconds summed over ensembles, ensembles counted, runs left out: no wall time, or no
    ensemble record because they finished before it existed)."""
    longest: dict[str, float] = {}
    left_out = 0
    for summary in summaries:
        seconds, ensemble = summary.get("wall_seconds"), summary.get("ensemble")
        if seconds is None or ensemble is None:
            left_out += 1
            continue
        longest[ensemble] = max(longest.get(ensemble, 0.0), seconds)
    return sum(longest.values()), len(longest), left_out


def total(summaries: Iterable[dict], field: str) -> float:
    return sum(s.get(field) or 0 for s in summaries)


def lines(summaries: list[dict]) -> list[str]:
    """The report's paragraph on what the sweep consumed."""
    seconds, ensembles, left_out = wall_seconds(summaries)
    line = (f"Consumed: {len(summaries)} runs, {total(summaries, 'tokens_seen'):.3g} tokens, "
            f"{total(summaries, 'train_flops'):.3g} train FLOPs; ")
    if not ensembles:  # runs made before the ensemble was recorded: a sum over runs would lie
        line += "wall time not recorded by these runs"
    else:
        line += f"wall time {seconds / 3600:.2f} h summed over {ensembles} ensemble(s)"
        if left_out:
            line += f" ({left_out} run(s) without an ensemble record or wall time not in it)"
    named = {machine(s["environment"]) for s in summaries if isinstance(s.get("environment"), dict)}
    # A kind alone (recorded before host_cpus) says less than the same kind with its CPUs.
    machines = sorted(m for m in named if not any(o.startswith(m + ", ") for o in named))
    return [line + (f", on {'; '.join(machines)}." if machines else ".")]


def machine(environment: dict) -> str:
    """'cpu, 2 host CPUs' or 'NVIDIA H200 ×8' (environments recorded before host_cpus: kind)."""
    kind, count = environment.get("device_kind"), environment.get("device_count") or 1
    text = f"{kind} ×{count}" if count > 1 else str(kind)
    cpus = environment.get("host_cpus")
    return f"{text}, {cpus} host CPUs" if cpus else text
