"""The sweep's `--plan` and `--budget_hours` (`planner` computes; this prints and refuses)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from scale_ablation.sweeping import arrangements, planner

SHORT = {"d_model": "d_model", "num_layers": "layers", "num_heads": "heads", "head_dim": "d_k",
         "qk_dim": "qk", "seq_len": "seq", "batch_size": "batch", "dtype": ""}


def describe(shape: tuple) -> str:
    """The shape's sizes and compute dtype, e.g. "d_model 512, layers 8, ..., bfloat16"."""
    return ", ".join(f"{SHORT[k]} {v}".strip() for k, v in shape if k in SHORT and v is not None)


def lines(plan: planner.Plan, what: str) -> list[str]:
    """The plan as text: one block per distinct shape, then the totals and the rate's rule."""
    out = [f"plan: {what}: {len(plan.runs)} runs in {len(plan.programs)} programs, on "
           f"{plan.device.kind}"]
    for shape in dict.fromkeys(r.shape for r in plan.runs):
        runs = [r for r in plan.runs if r.shape == shape]
        programs = [p for p in plan.programs if p.shape == shape]
        first = runs[0]
        passes = f"{first.passes:.3g}" if first.passes is not None else "unknown"
        known = plan.shapes.get(shape)
        memory = (f"peak {known.peak_bytes / 2**30:.2f} GiB a run (compiled here), "
                  f"{planner.members_that_fit(plan.device, known.peak_bytes)} fit a program"
                  if known else "memory not analysed")
        out += [f"  [{describe(shape)}]",
                f"    {len(runs)} runs, {first.parameters:,} parameters, {first.tokens:,} "
                f"tokens a run ({passes} passes), {sum(r.train_flops for r in runs):.3g} "
                f"train FLOPs",
                f"    {memory}; {len(programs)} programs, "
                f"{sum(p.seconds for p in programs) / 3600:.2f} device-hours"]
    out.append(f"total: {plan.train_flops:.3g} train FLOPs "
               f"(+{sum(r.other_flops for r in plan.runs):.3g} evaluation and diagnostics), "
               f"{plan.device_hours:.2f} device-hours on {plan.device.kind} "
               f"({plan.device_hours * 3600:,.0f} s)")
    out += [f"rate: {source}" for source in dict.fromkeys(p.rate_source for p in plan.programs)]
    return out


def over_budget(plan: planner.Plan, budget_hours: float) -> str | None:
    """One line refusing the plan when it needs more than `budget_hours`, else None."""
    if plan.device_hours <= budget_hours:
        return None
    return (f"error: --budget_hours={budget_hours:g}: the plan needs {plan.device_hours:.2f} "
            f"device-hours on {plan.device.kind} ({len(plan.runs)} runs); not started")


def table_for(dev: planner.Device, arrangement: arrangements.Arrangement | None) -> dict | None:
    """The rates a plan on `dev` uses: on a CPU, the measured rows of the arrangement the
    sweep will run (today's default if none is given) from this CPU family's table; else, or
    without one, the device's throughput table."""
    if dev.kind == "cpu":
        cpu_table = arrangements.read_table()
        if cpu_table is not None:
            found = arrangements.planner_table(cpu_table, arrangement or arrangements.DEFAULT)
            if found is not None:
                return found
    return planner.read_table(dev.kind)


def run(points: Sequence[Any], what: str, show: bool, budget_hours: float | None,
        device_name: str | None, arrangement: arrangements.Arrangement | None = None
        ) -> int | None:
    """`--plan` (print, exit 0) and `--budget_hours` (exit 2 over it): the exit code, or None
    to go on with the sweep. Writes nothing. `arrangement`: how the sweep will spread over a
    CPU's cores (its rate, from the CPU's table)."""
    try:
        dev = planner.device(device_name)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if budget_hours is not None and budget_hours <= 0:
        print(f"error: --budget_hours must be > 0, got {budget_hours:g}", file=sys.stderr)
        return 2
    plan = planner.make_plan(list(points), dev, table_for(dev, arrangement))
    if show:
        print("\n".join(lines(plan, what)))
    refusal = over_budget(plan, budget_hours) if budget_hours is not None else None
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    return 0 if show else None
