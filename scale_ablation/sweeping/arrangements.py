r"""How a sweep spreads over a CPU's cores: processes × threads × members, chosen from a table
measured on this CPU family (`python -m benchmarks.arrangements`, issue 56).

An arrangement is P processes of T threads each, each stepping programs of K runs:

  - in this process, every core, K runs per program (`--max_members=K`; K = 0 is today's
    default, a group's runs all in one program, stepped in turn on a CPU: `steps.over_members`);
  - P processes, one run each (`--parallel=P`), each pinned to T cores of its own
    (`--threads_per_process=T`) or not pinned (T = 0), their XLA given extra flags or not
    (`--process_xla_flags`: `NO_YNN` is the one the table measures).

The table is `benchmarks/results/arrangements_<cpu>_<cores>core_<date>.json` (or a folder named
by $SCALE_ABLATION_ARRANGEMENTS; "off" reads none), found by this machine's CPU model string
(/proc/cpuinfo's model name) and core count; tables measured under load (`"loaded": true`, a
`_LOADED` file) are not read. Its `entries` give each arrangement's train-step rate at a few
shapes (tokens/s over every process and member, FLOPs per token as the planner counts them,
compile seconds), its `overheads` the seconds a run spends outside its train steps (start-up,
evaluation, checkpoints: a fresh process per run costs more than a run in this process).

`choose` predicts a sweep's wall time under each arrangement the sweep can run (`seconds`:
per group, its runs' FLOPs over the rate of the entry nearest in FLOPs per token and members,
plus per-run overhead and a compile per program size) and keeps today's default unless another
is `MARGIN` faster. `planner_table` turns an arrangement's rows into the table
`planner.make_plan` reads, so that `--plan` on a CPU uses the measured rate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from scale_ablation.sweeping import planner

TABLES_VARIABLE = "SCALE_ABLATION_ARRANGEMENTS"  # a folder of tables, or "off"
MARGIN = 0.1  # another arrangement replaces the default only if predicted this much faster
PROGRAMS = ("solo", "map", "vmap")  # a run alone; K runs in turn (the sweep's); by vmap
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# XLA's CPU backend hands dots and their neighbours to YNNPACK fusions by default. At the
# studies' small shapes those fusions cost more than they save: dk_exponent:cpu's train step
# took 37.2 ms with them and 29.8 ms without (2 threads; 64.4 and 53.6 ms on one pinned core),
# the main job's 35.2 and 27.7, but mup_transfer:cpu's (seq 128) 75.3 and 97.3 (2-core EPYC,
# 2026-12-06, `benchmarks/profile_step.py`'s shapes): so it is a measured choice per shape.
# It can only be set before a process's XLA starts: the sweep gives it to --parallel processes.
NO_YNN = "--xla_cpu_experimental_ynn_fusion_type="


@dataclasses.dataclass(frozen=True)
class Arrangement:
    processes: int = 1
    threads: int = 0  # cores each process is pinned to; 0: not pinned
    members: int = 0  # runs per program; 0: a group's runs all in one program
    program: str = "map"
    xla_flags: str = ""  # added to XLA_FLAGS in each of the processes (P > 1 only)

    @property
    def workers(self) -> bool:
        """P processes each training ensembles (`--workers`), not one run a process."""
        return self.processes > 1 and self.program == "map"

    @property
    def runnable(self) -> bool:
        """Whether the sweep can run it: one process with ensembles, one run a process
        (`--parallel`), or pinned processes of ensembles (`--workers`)."""
        if self.program == "vmap" or (self.xla_flags and self.processes == 1):
            return False  # the sweep's CPU ensembles step in turn (steps.over_members)
        if self.processes == 1:
            return self.threads == 0
        return self.members == 1 if self.program == "solo" else self.threads > 0

    def flags(self) -> list[str]:
        """The sweep's flags that give this arrangement."""
        if self.processes == 1:
            return [f"--max_members={self.members}"]
        runner = (f"--workers={self.processes}", f"--max_members={self.members}") \
            if self.workers else (f"--parallel={self.processes}",)
        return [*runner, *([f"--threads_per_process={self.threads}"] * bool(self.threads)),
                *([f"--process_xla_flags={self.xla_flags}"] * bool(self.xla_flags))]

    def describe(self) -> str:
        threads = f"{self.threads} thread{'s' * (self.threads > 1)} each" if self.threads \
            else "threads not pinned"
        members = {0: f"a group's runs as one program ({self.program})",
                   1: "one run a program"}.get(self.members,
                                               f"{self.members} runs a program ({self.program})")
        xla = f", XLA flags {self.xla_flags}" if self.xla_flags else ""
        return (f"{self.processes} process{'es' * (self.processes > 1)}, {threads}, "
                f"{members}{xla}")


DEFAULT = Arrangement()  # today's: this process, a group's runs as one program, in turn


def of_entry(entry: dict) -> Arrangement:
    """The arrangement a table row measured (members as measured)."""
    return Arrangement(entry["processes"], entry["threads"], entry["members"], entry["program"],
                       entry.get("xla_flags", ""))


def same_family(entry: dict, arrangement: Arrangement) -> bool:
    """Whether `entry` measured `arrangement` at some member count. A program of one run is
    the solo program in every family (a group's last, smaller program can be one)."""
    if entry.get("side", "jax") != "jax" or (
            entry["processes"], entry["threads"], entry.get("xla_flags", "")) != (
            arrangement.processes, arrangement.threads, arrangement.xla_flags):
        return False
    if entry["members"] == 1:
        return True
    return arrangement.members != 1 and entry["program"] == arrangement.program


def machine() -> tuple[str, int]:
    """(CPU model string, cores) that tables are keyed by."""
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), model)
    return model, os.cpu_count() or 1


def tables_folder() -> str | None:
    """Where tables are read: $SCALE_ABLATION_ARRANGEMENTS, none for "off", else the repo's
    benchmarks/results."""
    folder = os.environ.get(TABLES_VARIABLE)
    if folder is not None:
        return None if folder.strip().lower() in ("", "off") else folder
    return planner.RESULTS


def read_table(folder: str | None = None, where: tuple[str, int] | None = None
               ) -> dict | None:
    """The newest table measured idle on this CPU model with this many cores, or None. Its
    path is under "path"."""
    folder = tables_folder() if folder is None else folder
    if not folder:
        return None
    model, cores = where or machine()
    found = []
    for path in glob.glob(os.path.join(folder, "arrangements_*.json")):
        try:
            with open(path) as f:
                table = json.load(f)
        except (OSError, ValueError):
            continue  # a file being written, or not a table: the sweep goes on without it
        if (table.get("cpu_model") == model and table.get("cores") == cores
                and not table.get("loaded") and table.get("entries")):
            found.append((table.get("date", ""), path, table))
    if not found:
        return None
    _, path, table = max(found)
    return {**table, "path": path}


def nearest(rows: Sequence[dict], flops_per_token: float, members: int) -> dict:
    """The row nearest in FLOPs per token and members, on log scales (`planner.rate`'s rule)."""
    def distance(row: dict) -> float:
        return (abs(math.log(row["flops_per_token"] / flops_per_token))
                + abs(math.log(row.get("members", 1) / max(members, 1))))

    return min(rows, key=distance)


def flop_rate(entry: dict) -> float:
    """FLOP/s of a row: its tokens/s (every process and member) × FLOPs per token."""
    return entry["tokens_per_s"] * entry["flops_per_token"]


def run_overhead(table: dict, arrangement: Arrangement, flops_per_token: float,
                 members: int) -> float:
    """Wall seconds a run adds outside its train steps: its runner's measured overhead
    (nearest shape) shared by the processes that overlap it. A worker's runs pay the
    in-process overhead: measured on every core, it takes P times as long on a worker's share
    of them, and P workers overlap (assumed, not measured)."""
    if arrangement.processes == 1 or arrangement.workers:
        arrangement = Arrangement(members=arrangement.members)
    runner = "process" if arrangement.processes > 1 else "in_process"
    rows = [row for row in table.get("overheads", []) if row["runner"] == runner
            and row["processes"] == arrangement.processes
            and row["threads"] == arrangement.threads
            and row.get("xla_flags", "") == arrangement.xla_flags]
    if not rows:
        return 0.0
    row = nearest(rows, flops_per_token, members)
    return row["run_overhead_s"] / arrangement.processes


@dataclasses.dataclass(frozen=True)
class Group:
    """Runs that train as one program in this process (`planner.program_key`)."""

    flops_per_token: float
    run_flops: tuple[float, ...]  # each run's train, evaluation and diagnostics FLOPs


def groups_of(points: Sequence[Any]) -> list[Group]:
    """The sweep points' groups with their FLOPs (`planner.run_cost`)."""
    by_key: dict[tuple, list[planner.RunCost]] = {}
    for point in points:
        by_key.setdefault(planner.program_key(point.config), []).append(
            planner.run_cost(point.name, point.config))
    return [Group(costs[0].flops_per_token,
                  tuple(c.train_flops + c.other_flops for c in costs))
            for costs in by_key.values()]


def program_sizes(runs: int, arrangement: Arrangement) -> list[int]:
    """Members of each program a group of `runs` trains as (`planner.programs_of`)."""
    size = arrangement.members or runs
    return [len(p) for p in planner.programs_of(list(range(runs)), size)]


def seconds(groups: Sequence[Group], table: dict, arrangement: Arrangement) -> float:
    """Predicted wall seconds of `groups` under `arrangement` (inf if the table lacks it).
    Workers take whole groups (`workers.shares`' rule, by time here), each at 1/P of the row's
    rate (measured over all P at once): the sweep ends with the slowest share, so a sweep of
    one group gains nothing from them."""
    rows = [e for e in table.get("entries", []) if same_family(e, arrangement)]
    if not rows:
        return math.inf
    times = [_group_seconds(group, table, arrangement, rows) for group in groups]
    if not arrangement.workers:
        return sum(times)
    loads = [0.0] * arrangement.processes
    for time in sorted(times, reverse=True):
        loads[loads.index(min(loads))] += time * arrangement.processes
    return max(loads)


def _group_seconds(group: Group, table: dict, arrangement: Arrangement,
                   rows: list[dict]) -> float:
    """One group's seconds at the family's rows' rate: its programs' FLOPs, its runs' overhead
    outside their steps and a compilation per program size (jit's cache per K)."""
    sizes = program_sizes(len(group.run_flops), arrangement)
    total, start = 0.0, 0
    for size in sizes:
        row = nearest(rows, group.flops_per_token, size)
        flops = sum(group.run_flops[start:start + size])
        total += flops / flop_rate(row) + size * run_overhead(
            table, arrangement, group.flops_per_token, size)
        start += size
    for size in set(sizes):
        total += nearest(rows, group.flops_per_token, size).get("compile_s", 0.0)
    return total


def candidates(table: dict) -> list[Arrangement]:
    """Today's default and every arrangement in the table the sweep can run here (pinned
    processes need cores of their own within this process's mask). Workers also with a
    group's runs as one program (K = 0, as the default): K = 16 would split a group of 20
    into programs of 16 and 4, each compiled."""
    found = dict.fromkeys([DEFAULT])
    for entry in table.get("entries", []):
        if entry.get("side", "jax") == "jax":
            arrangement = of_entry(entry)
            fits = not arrangement.threads or len(
                cpu_sets(arrangement.threads, arrangement.processes)) == arrangement.processes
            if arrangement.runnable and fits:
                found[arrangement] = None
                if arrangement.workers:
                    found[dataclasses.replace(arrangement, members=0)] = None
    return list(found)


@dataclasses.dataclass(frozen=True)
class Choice:
    arrangement: Arrangement
    seconds: float
    default_seconds: float
    table_path: str

    @staticmethod
    def _time(seconds: float) -> str:
        return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.0f} s"

    def line(self) -> str:
        """The sweep's line saying what it picked and why."""
        flags = " ".join(self.arrangement.flags())
        if self.arrangement == DEFAULT:
            return (f"arrangement: {self.arrangement.describe()} (today's default; the table "
                    f"predicts nothing {MARGIN:.0%} faster: {self._time(self.default_seconds)}; "
                    f"{os.path.basename(self.table_path)})")
        return (f"arrangement: {self.arrangement.describe()} ({flags}; predicted "
                f"{self._time(self.seconds)} against {self._time(self.default_seconds)} for "
                f"the default, from {os.path.basename(self.table_path)})")


def choose(groups: Sequence[Group], table: dict) -> Choice:
    """The fastest runnable arrangement for `groups` by the table; the default unless another
    is predicted `MARGIN` faster (the table's own noise should not move a sweep)."""
    default = seconds(groups, table, DEFAULT)
    timed = [(seconds(groups, table, a), i, a) for i, a in enumerate(candidates(table))]
    best_seconds, _, best = min(timed)
    if not best_seconds < default * (1 - MARGIN):
        best, best_seconds = DEFAULT, default
    return Choice(best, best_seconds, default, table.get("path", "table"))


def choose_here(points: Sequence[Any]) -> Choice | None:
    """`choose` for the sweep's points on this machine; None without a table for this CPU,
    or when JAX's backend here is not the CPU (read only once a table is found: asking
    starts the backend, which on a GPU machine takes the GPU's memory)."""
    table = read_table()
    if table is None:
        return None
    if jax.default_backend() != "cpu":
        return None
    return choose(groups_of(points), table)


def planner_table(table: dict, arrangement: Arrangement) -> dict | None:
    """The rows `planner.make_plan` reads for `arrangement` (None if the table lacks it):
    entries of its family with each one's per-run overhead, and its members' cap."""
    rows = [e for e in table.get("entries", []) if same_family(e, arrangement)]
    if not rows:
        return None
    entries = [{"name": row["shape"], "members": row["members"],
                "flops_per_token": row["flops_per_token"], "tokens_per_s": row["tokens_per_s"],
                "run_overhead_s": run_overhead(table, arrangement, row["flops_per_token"],
                                               row["members"])} for row in rows]
    cap = arrangement.members
    return {"device_kind": f"cpu ({table['cpu_model']}, {table['cores']} cores)",
            "date": table.get("date"), "arrangement": arrangement.describe(),
            "max_members": cap, "entries": entries}


def from_flags(parallel: int, ensemble: bool, max_members: int, threads: int,
               xla_flags: str = "", workers: int = 1) -> Arrangement:
    """The arrangement the sweep's own flags give."""
    if parallel > 1:
        return Arrangement(parallel, threads, 1, "solo", xla_flags)
    if workers > 1:
        return Arrangement(workers, threads, max_members if ensemble else 1, "map", xla_flags)
    return Arrangement(1, 0, max_members if ensemble else 1, "map")


def cpu_sets(threads: int, processes: int) -> list[frozenset[int]]:
    """`processes` disjoint sets of `threads` of this process's cores (fewer if they run
    out)."""
    cores = sorted(os.sched_getaffinity(0))
    return [frozenset(cores[i:i + threads]) for i in range(0, threads * processes, threads)
            if len(cores[i:i + threads]) == threads]


def _children_masks() -> list[frozenset[int]]:
    """The CPU masks of this process's live children."""
    me, masks = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == me and fields[0] != "Z":
                masks.append(frozenset(os.sched_getaffinity(int(entry))))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return masks


@contextlib.contextmanager
def pinned_children(threads: int, processes: int
                    ) -> Iterator[Callable[[Callable[[Any], None]], Callable[[Any], None]]]:
    """Within it, `wrap(before_start)` returns a `before_start` that also pins the process
    about to start to `threads` cores no live child holds, and the thread counts of XLA's
    pool (sized by the mask), OpenMP and BLAS follow. The mask is set on this thread, which
    the child inherits at fork, so the runner needs no change; it is restored on exit.
    `threads` 0: nothing is pinned."""
    if threads <= 0:
        yield lambda before: before
        return
    sets, mask = cpu_sets(threads, processes), os.sched_getaffinity(0)
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(threads) for name in THREAD_VARIABLES})

    def wrap(before: Callable[[Any], None]) -> Callable[[Any], None]:
        def pin(point: Any) -> None:
            before(point)
            taken = set(_children_masks())
            free = next((s for s in sets if s not in taken), sets[0])
            os.sched_setaffinity(0, free)
        return pin

    try:
        yield wrap
    finally:
        os.sched_setaffinity(0, mask)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
