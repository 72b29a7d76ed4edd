r"""Runs per hour of every arrangement a sweep can use, at the CPU studies' own shapes, with
PyTorch's loop of runs beside it (issue 56):

    python -m benchmarks.arrangements [--shapes=dk_exponent,mup_transfer,headline]
        [--members=1,2,4,8,16] [--processes=1,CORES] [--window=5] [--rounds=2]
        [--out=FILE.json]

writes `benchmarks/results/arrangements_<cpu>_<cores>core_<date>.json` (`_LOADED` when the
machine was busy: the sweep does not read those), the table `scale_ablation.sweeping.arrangements`
picks a sweep's arrangement from and `--plan` takes its CPU rate from.

Shapes (`SHAPES`): dk_exponent:cpu (d_model 128, 2 layers, 4 heads × 32, seq 64, batch 16, 400
steps; the study's d_k 8-256 at its middle, d_k 32), mup_transfer:cpu at width 128 (4 heads × 32,
seq 128, batch 16, 300 steps) and the main job (experiments/headline.py: 1 head × 128, seq 128,
batch 16, 500 steps). Arrangements, for P in `--processes`: one process on every core (threads
not pinned); P processes each pinned to cores/P cores of its own (`os.sched_setaffinity` before
JAX starts: XLA sizes its thread pool by the mask; OpenMP and BLAS get cores/P threads); P
processes not pinned (today's `--parallel=P`); P pinned processes with YNNPACK's fusions off
(`arrangements.NO_YNN` in their XLA_FLAGS, solo programs: what `--parallel` runs). In each,
programs of K runs for K in `--members`:
K = 1 the solo train step, K > 1 the sweep's ensemble program (on a CPU the members in turn,
`steps.over_members`) and the same members `vmap`ped. PyTorch: reference_gpt2's GPT-2 with
nanoGPT's attention call (`benchmarks.vs_pytorch.torch_model`), eager, one process of
`torch.set_num_threads(cores)` and P pinned processes of cores/P threads.

Each measurement is a worker process per process of the arrangement; the workers compile and
warm up, then start their timed windows together (`--window` seconds of train steps each; the
rate is steps × members over the window, summed over the workers). `--rounds` rounds, the order
of shapes reversed every other round; a figure is the median of its rounds. FLOPs per step are
the planner's (`planner.run_cost`: `provenance.flops_per_token` × batch × seq, causal attention
halved; the same count on the PyTorch side, the same model), and MFU is over a float32 2048²
matmul measured by XLA on every core in the same run (PyTorch's own peak is beside it).

Runs per hour: 3600 / (steps / run-steps per second + the run's wall seconds outside its
steps). That overhead is measured per runner: in this process (`train.train_runs` of a short
run with the study's evaluations, diagnostics and checkpoints, minus its steps at the measured
rate: evaluation, W&B, checkpoints), and a fresh `scale_ablation.main` process per run (the
same, plus start-up and the compilation cache's load), divided by the P processes overlapping
it. Combinations the sweep cannot run (P processes of K > 1 members, vmap) take the in-process
overhead over P (marked "assumed"); PyTorch's is building its model and optimiser. Compilation
is not in runs per hour (`compile_s` beside it: a sweep pays it once per group).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import run as bench
from scale_ablation.sweeping import arrangements

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
# name -> (experiment spec, overrides): one representative run of each study.
SHAPES = {
    "dk_exponent": ("experiments/dk_exponent.py:cpu",
                    {"policy": "inv_sqrt_dk", "model.init": "fan_in", "train.lr": 5e-3}),
    "mup_transfer": ("experiments/mup_transfer.py:cpu",
                     {"model.parametrization": "sp", "policy": "inv_sqrt_dk",
                      "model.d_model": 128, "model.head_dim": 32, "train.lr": 4e-3}),
    "headline": ("experiments/headline.py", {"policy": "inv_sqrt_dk", "train.lr": 3e-3}),
}
QUICK = {"dk_exponent": "experiments/dk_exponent.py:quick",
         "mup_transfer": "experiments/mup_transfer.py:quick",
         "headline": "experiments/headline.py:quick"}
QUICK_OVERRIDES = {"mup_transfer": {"model.d_model": 64, "model.head_dim": 32}}
SHORT_STEPS = 10  # a short run's steps, for the overheads


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def shape_config(name: str, quick: bool = False):
    """The config of shape `name` (the study's own, or its `quick` variant for tests)."""
    from scale_ablation.training import experiment_files as experiment
    from scale_ablation.training import runtime

    spec, overrides = shape_spec(name, quick)
    runtime.make_experiments_importable(spec)
    return experiment.apply_overrides(experiment.load_config(spec), overrides)


def shape_spec(name: str, quick: bool = False) -> tuple[str, dict]:
    """(experiment spec, overrides) of shape `name`."""
    if quick:
        return QUICK[name], {**SHAPES[name][1], **QUICK_OVERRIDES.get(name, {})}
    return SHAPES[name]


def flops_per_step(config) -> tuple[float, int]:
    """(training FLOPs of one step, tokens a step): the planner's count for one run."""
    from scale_ablation.sweeping import planner

    cost = planner.run_cost("step", config)
    tokens = config.train.batch_size * config.data.seq_len
    return cost.flops_per_token * tokens, tokens


def short_overrides(config, steps: int = SHORT_STEPS) -> dict:
    """A run of `steps` steps with as many evaluations, diagnostics, checkpoints and log rows
    as `config`'s own (each cadence scaled by steps / the config's steps)."""
    t = config.train

    def scaled(every: int) -> int:
        return max(1, every * steps // t.steps) if every else 0

    return {"train.steps": steps, "train.warmup_steps": scaled(t.warmup_steps),
            "train.eval_every": scaled(t.eval_every), "train.diag_every": scaled(t.diag_every),
            "train.log_every": scaled(t.log_every),
            "checkpoint.every": scaled(config.checkpoint.every)}


# --- the worker side: one process of an arrangement ------------------------------------------


def _say(message: dict) -> None:
    print(json.dumps(message), flush=True)


def _window(step, window: float) -> dict:
    """Call `step()` (blocking) until `window` seconds have passed, at least twice."""
    calls, start = 0, time.perf_counter()
    while True:
        step()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= window and calls >= 2:
            return {"calls": calls, "seconds": elapsed}


def member_inputs(config, members: int) -> tuple:
    """(graphdef, the initial states of seeds 0..members-1, a batch of synthetic bytes each):
    what a step program of `members` runs is timed on."""
    import numpy as np

    from scale_ablation.training import experiment_files as experiment
    from scale_ablation.training import run_setup

    states = []
    for seed in range(members):
        graphdef, state = run_setup.init_state(
            experiment.apply_overrides(config, {"train.seed": seed}))
        states.append(state)
    shape = (config.train.batch_size, config.data.seq_len)
    rng = np.random.default_rng(0)  # the step's cost does not depend on the bytes
    rows = [{"inputs": rng.integers(0, 256, shape, np.int32),
             "targets": rng.integers(0, 256, shape, np.int32),
             "weights": np.ones(shape, np.float32)} for _ in range(members)]
    return graphdef, states, rows


def _jax_program(config, members: int, program: str):
    """(step(), compile seconds): the sweep's train-step program of `members` runs (solo for
    one, the members in turn on a CPU for more: `steps.Programs`), or `vmap`ped, on synthetic
    bytes."""
    import jax
    import jax.numpy as jnp

    from scale_ablation.training import steps
    from scale_ablation.training.optim import OptimizerSettings

    graphdef, states, rows = member_inputs(config, members)
    programs = steps.programs(graphdef, OptimizerSettings.of(config), float(config.train.z_loss))
    stack = lambda trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees)  # noqa: E731
    if members == 1:
        fn, state, batch, seeds = programs.train, states[0], rows[0], jnp.int32(0)
    else:
        state, batch, seeds = stack(states), stack(rows), jnp.arange(members, dtype=jnp.int32)
        fn = programs.train_members if program == "map" else jax.jit(
            jax.vmap(programs.seeded_step), donate_argnums=0,
            compiler_options=steps.compiler_options())
    batch = jax.device_put(batch)
    start = time.perf_counter()
    compiled = fn.lower(state, batch, seeds).compile()
    compile_s = time.perf_counter() - start
    holder = {"state": state}

    def step():
        holder["state"], metrics = compiled(holder["state"], batch, seeds)
        jax.block_until_ready(metrics)

    for _ in range(2):  # warm-up
        step()
    return step, compile_s


def _torch_program(config, threads: int):
    """(step(), seconds to build a run's model and optimiser): nanoGPT's model at the shape."""
    import torch

    from benchmarks import vs_pytorch

    torch.set_num_threads(threads)
    shape = vs_pytorch.shape_of(config)
    builds = []
    for _ in range(3):
        start = time.perf_counter()
        model, opt, _ = vs_pytorch.torch_model(shape)
        builds.append(time.perf_counter() - start)
    step = vs_pytorch.torch_step(model, opt, shape, config.data.seq_len)
    for _ in range(2):
        step()
    return step, statistics.median(builds)


def _matmul(side: str, threads: int):
    """(step(), 2n³): one float32 2048² matmul by XLA or PyTorch."""
    n = 2048
    if side == "torch":
        import torch

        torch.set_num_threads(threads)
        a = torch.randn(n, n)
        return (lambda: torch.matmul(a, a)), 2 * n**3
    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, a))
    return (lambda: jax.block_until_ready(matmul(a, a))), 2 * n**3


def _short_runs(config, members: int, folder: str):
    """(step(), 0): `members` short runs of `config` trained in this process (`train_runs`),
    once to compile, then timed afresh in new directories."""
    from scale_ablation.training import experiment_files as experiment
    from scale_ablation.training import train

    short = experiment.apply_overrides(config, short_overrides(config))
    configs = [experiment.apply_overrides(short, {"train.seed": s}) for s in range(members)]
    counter = iter(range(1_000_000))

    def runs():
        where = os.path.join(folder, str(next(counter)))
        dirs = [os.path.join(where, f"m{i}") for i in range(members)]
        train.train_runs(configs, dirs, progress=False)

    runs()
    return runs, 0.0


def prepare(measurement: dict, spec: dict):
    """(step(), a number to report: compile or build seconds) for one measurement."""
    kind = measurement["kind"]
    if kind == "matmul":
        step, flops = _matmul(spec["side"], spec["threads"])
        return step, flops
    config = shape_config(spec["shape"], spec["quick"])
    if kind == "runs":
        return _short_runs(config, measurement["members"], spec["folder"])
    if spec["side"] == "torch":
        return _torch_program(config, spec["threads"])
    return _jax_program(config, measurement["members"], measurement["program"])


def worker(spec: dict) -> int:
    """One process of an arrangement: each measurement prepared, then timed on "go"."""
    for index, measurement in enumerate(spec["measurements"]):
        try:
            step, number = prepare(measurement, spec)
        except Exception as error:  # the parent prints it and stops
            _say({"error": f"{type(error).__name__}: {error}"})
            return 1
        _say({"ready": index})
        if sys.stdin.readline().strip() != "go":
            return 1
        if measurement["kind"] == "runs":  # one timed call: the runs themselves
            start = time.perf_counter()
            step()
            timed = {"calls": 1, "seconds": time.perf_counter() - start}
        else:
            timed = _window(step, spec["window"])
        _say({"result": index, "number": number, **timed})
    return 0


# --- the parent side: arrangements, their workers, the table ---------------------------------


def pinned(argv: list[str], cpus: frozenset[int] | None) -> list[str]:
    """`argv` (a Python command) started on `cpus` alone: a trampoline sets the mask and execs
    it, so that JAX's and torch's thread pools, sized when they start, follow it. (Not a
    preexec_fn: this process runs JAX's threads, and fork with them is unsafe.)"""
    if not cpus:
        return argv
    trampoline = (f"import os, sys; os.sched_setaffinity(0, {sorted(cpus)}); "
                  "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    return [sys.executable, "-c", trampoline, *argv[1:]]


def thread_env(threads: int, xla_flags: str = "") -> dict[str, str]:
    """A worker's environment: W&B offline and quiet; OpenMP's and BLAS's threads `threads`;
    `xla_flags` added to XLA_FLAGS (as the sweep adds `--process_xla_flags`)."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    if threads:
        env.update({name: str(threads) for name in arrangements.THREAD_VARIABLES})
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    return env


def _spawn(spec: dict, cpus: frozenset[int] | None, threads: int, log) -> subprocess.Popen:
    argv = [sys.executable, "-m", "benchmarks.arrangements", f"--worker={json.dumps(spec)}"]
    env = thread_env(threads, spec.get("xla_flags", ""))
    return subprocess.Popen(pinned(argv, cpus), cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)


def _read(process: subprocess.Popen, key: str, log_path: str) -> dict:
    """The worker's next message carrying `key` (other stdout lines are not ours)."""
    for line in process.stdout:
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict) and "error" in message:
                raise RuntimeError(f"worker: {message['error']}\n{_tail(log_path)}")
            if isinstance(message, dict) and key in message:
                return message
    raise RuntimeError(f"worker exited ({process.wait()}) before '{key}'\n{_tail(log_path)}")


def _tail(path: str) -> str:
    with contextlib.suppress(OSError), open(path) as f:
        return f.read()[-3000:]
    return ""


def measure(spec: dict, processes: int, threads: int) -> list[list[dict]]:
    """`spec`'s measurements in `processes` workers (pinned to `threads` cores each, or not
    pinned for 0), their timed windows started together: per measurement, each worker's
    result."""
    sets = arrangements.cpu_sets(threads, processes) if threads else [None] * processes
    with tempfile.TemporaryDirectory() as tmp:
        logs = [open(os.path.join(tmp, f"{i}.log"), "w") for i in range(processes)]  # noqa: SIM115
        workers = [_spawn({**spec, "folder": os.path.join(tmp, f"w{i}")}, cpus, threads, log)
                   for i, (cpus, log) in enumerate(zip(sets, logs, strict=True))]
        try:
            results = []
            for _ in spec["measurements"]:
                for i, process in enumerate(workers):
                    _read(process, "ready", logs[i].name)
                for process in workers:
                    process.stdin.write("go\n")
                    process.stdin.flush()
                results.append([_read(p, "result", logs[i].name) for i, p in enumerate(workers)])
            return results
        finally:
            for process in workers:
                with contextlib.suppress(OSError):
                    process.stdin.close()
                process.wait(timeout=600)
            for log in logs:
                log.close()


def families(cores: int, processes: list[int]) -> list[tuple[str, int, int, str]]:
    """(side, processes, threads, XLA flags) of every arrangement measured: one process on every
    core (threads not pinned), P pinned processes of cores/P, with YNN's fusions and without,
    and P not pinned (JAX only)."""
    out = [("jax", 1, 0, ""), ("torch", 1, 0, "")]
    for p in processes:
        if p > 1:
            out += [("jax", p, cores // p, ""), ("jax", p, cores // p, arrangements.NO_YNN),
                    ("torch", p, cores // p, ""), ("jax", p, 0, "")]
    return out


def measurements(side: str, processes: int, threads: int, members: list[int],
                 xla_flags: str = "") -> list[dict]:
    """The programs an arrangement is measured with: K = 1, then each K > 1 in turn ("map") and
    vmap (JAX; a not-pinned `--parallel` runs solo runs only, and pinned processes given XLA
    flags skip vmap, slower on a CPU at every shape measured); PyTorch's one model."""
    if side == "torch":
        return [{"kind": "step", "members": 1, "program": "torch"}]
    solo = [{"kind": "step", "members": 1, "program": "solo"}]
    if processes > 1 and threads == 0:
        return solo
    programs = ("map",) if xla_flags else ("map", "vmap")
    return solo + [{"kind": "step", "members": k, "program": program}
                   for program in programs for k in members if k > 1]


def step_rows(shape: str, side: str, processes: int, threads: int, xla_flags: str,
              args) -> list[dict]:
    """One round of one arrangement family at one shape: a row per measurement."""
    todo = measurements(side, processes, threads, args.members, xla_flags)
    spec = {"side": side, "shape": shape, "quick": args.quick, "window": args.window,
            "threads": threads or args.cores, "measurements": todo, "xla_flags": xla_flags}
    rows = []
    for wanted, results in zip(todo, measure(spec, processes, threads), strict=True):
        run_steps = sum(r["calls"] * wanted["members"] / r["seconds"] for r in results)
        rows.append({"shape": shape, "side": side, "processes": processes, "threads": threads,
                     "members": wanted["members"], "program": wanted["program"],
                     "xla_flags": xla_flags, "run_steps_per_s": run_steps,
                     "compile_s" if side == "jax" else "build_s":
                         statistics.median(r["number"] for r in results)})
    return rows


def peaks(cores: int, window: float) -> dict:
    """Float32 2048² matmul GFLOP/s: XLA on every core, XLA on one pinned core, PyTorch."""
    out = {}
    for name, side, threads in (("xla_all_cores", "jax", 0), ("xla_one_core", "jax", 1),
                                ("torch_all_threads", "torch", 0)):
        spec = {"side": side, "window": window, "threads": threads or cores,
                "measurements": [{"kind": "matmul"}]}
        (result,), = measure(spec, 1, threads)
        out[name] = result["number"] * result["calls"] / result["seconds"] / 1e9
    return out


def in_process_overhead(shape: str, members: int, args) -> float:
    """Wall seconds of `members` short runs in one process (every core), timed warm."""
    spec = {"side": "jax", "shape": shape, "quick": args.quick, "window": 0.0,
            "threads": args.cores, "measurements": [{"kind": "runs", "members": members}]}
    (result,), = measure(spec, 1, 0)
    return result["seconds"]


def process_overhead(shape: str, processes: int, threads: int, args,
                     xla_flags: str = "") -> float:
    """Median wall seconds of a short `scale_ablation.main` run, `processes` at once (pinned
    to `threads` cores each, or not), the second of two rounds (the cache then loaded)."""
    from scale_ablation.training import experiment_files as experiment

    spec, overrides = shape_spec(shape, args.quick)
    overrides = {**overrides, **short_overrides(shape_config(shape, args.quick))}
    sets = arrangements.cpu_sets(threads, processes) if threads else [None] * processes
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(2):
            started, running = time.perf_counter(), []
            for i, cpus in enumerate(sets):
                argv = [sys.executable, "-m", "scale_ablation.main", f"--config={spec}",
                        f"--workdir={tmp}/{attempt}_{i}", *experiment.override_flags(overrides)]
                with open(f"{tmp}/{attempt}_{i}.log", "w") as log:
                    running.append(subprocess.Popen(
                        pinned(argv, cpus), cwd=REPO, env=thread_env(threads, xla_flags),
                        stdout=log, stderr=subprocess.STDOUT))
            walls = _exit_times(running, started)
            for i, process in enumerate(running):
                if process.returncode != 0:
                    raise RuntimeError(f"scale_ablation.main failed:\n"
                                       f"{_tail(f'{tmp}/{attempt}_{i}.log')}")
    return statistics.median(walls)


def _exit_times(processes: list[subprocess.Popen], started: float) -> list[float]:
    """Seconds from `started` to each process's exit (polled every 10 ms)."""
    walls: dict[int, float] = {}
    while len(walls) < len(processes):
        for i, process in enumerate(processes):
            if i not in walls and process.poll() is not None:
                walls[i] = time.perf_counter() - started
        time.sleep(0.01)
    return [walls[i] for i in range(len(processes))]


ARRANGEMENT_KEY = ("shape", "side", "processes", "threads", "members", "program", "xla_flags")


def median_rows(rounds: list[list[dict]], key: tuple[str, ...] = ARRANGEMENT_KEY,
                fields: tuple[str, ...] = ("run_steps_per_s",)) -> list[dict]:
    """Each measurement's rows over the rounds as one (rows alike in `key`): the median of
    each of `fields`, every round's rate kept beside it."""
    by_key: dict[tuple, list[dict]] = {}
    for rows in rounds:
        for row in rows:
            by_key.setdefault(tuple(row.get(k, "") for k in key), []).append(row)
    return [{**rows[0], **{f: statistics.median(r[f] for r in rows) for f in fields},
             "rounds": [r["run_steps_per_s"] for r in rows]}
            for rows in by_key.values()]


def annotate(rows: list[dict], shapes: dict, peak_gflops: float) -> None:
    """Tokens/s, FLOPs, GFLOP/s, MFU and the train steps' runs per hour of each row."""
    for row in rows:
        shape = shapes[row["shape"]]
        row["tokens_per_s"] = row["run_steps_per_s"] * shape["tokens_per_step"]
        row["flops_per_token"] = shape["flops_per_token"]
        row["gflops"] = row["run_steps_per_s"] * shape["flops_per_step"] / 1e9
        row["mfu"] = row["gflops"] / peak_gflops
        row["runnable"] = row["side"] == "jax" and arrangements.of_entry(row).runnable
        row["runs_per_hour_steps_only"] = 3600 * row["run_steps_per_s"] / shape["steps"]


def _rate(rows: list[dict], shape: str, processes: int, threads: int, members: int,
          xla_flags: str = "") -> float:
    """Run-steps/s of the sweep's program (solo or its members in turn) in one arrangement."""
    return next(r["run_steps_per_s"] for r in rows if r["shape"] == shape and r["side"] == "jax"
                and (r["processes"], r["threads"], r["members"], r.get("xla_flags", ""))
                == (processes, threads, members, xla_flags) and r["program"] in ("solo", "map"))


def overhead_rows(shapes: dict, rows: list[dict], args) -> list[dict]:
    """Per shape and runner, the seconds a run spends outside its train steps."""
    out = []
    for name, shape in shapes.items():
        for members in sorted({1, max(args.members)}):
            wall = in_process_overhead(name, members, args)
            steps = SHORT_STEPS * members / _rate(rows, name, 1, 0, members)
            out.append({"shape": name, "runner": "in_process", "processes": 1, "threads": 0,
                        "members": members, "flops_per_token": shape["flops_per_token"],
                        "short_run_s": wall, "run_overhead_s": max(0.0, (wall - steps) / members)})
        for p in args.processes:
            pinned_cores = args.cores // p
            variants = ((pinned_cores, ""), (pinned_cores, arrangements.NO_YNN), (0, ""))
            for threads, xla_flags in (variants if p > 1 else ()):
                wall = process_overhead(name, p, threads, args, xla_flags)
                steps = SHORT_STEPS * p / _rate(rows, name, p, threads, 1, xla_flags)
                out.append({"shape": name, "runner": "process", "processes": p,
                            "threads": threads, "xla_flags": xla_flags, "members": 1,
                            "flops_per_token": shape["flops_per_token"], "short_run_s": wall,
                            "run_overhead_s": max(0.0, wall - steps)})
    return out


def runs_per_hour(rows: list[dict], overheads: list[dict], shapes: dict) -> None:
    """Each row's runs per hour with its runner's per-run overhead (see the docstring)."""
    for row in rows:
        steps = shapes[row["shape"]]["steps"]
        p = row["processes"]
        if row["side"] == "torch":
            wall, basis = row["build_s"] / p, "building the model and optimiser"
        else:
            arrangement = arrangements.of_entry(row)
            table = {"overheads": [o for o in overheads if o["shape"] == row["shape"]]}
            if arrangement.runnable:
                wall = arrangements.run_overhead(table, arrangement, row["flops_per_token"],
                                                 row["members"])
                basis = "measured"
            else:
                wall = arrangements.run_overhead(table, arrangements.Arrangement(
                    members=row["members"]), row["flops_per_token"], row["members"]) / p
                basis = "assumed: in-process overhead over the processes"
        row["run_overhead_wall_s"], row["overhead_basis"] = wall, basis
        row["runs_per_hour"] = 3600 / (steps / row["run_steps_per_s"] + wall)


def shapes_of(names: list[str], quick: bool) -> dict:
    out = {}
    for name in names:
        config = shape_config(name, quick)
        flops, tokens = flops_per_step(config)
        spec, overrides = shape_spec(name, quick)
        m = config.model
        out[name] = {"spec": spec, "overrides": overrides, "steps": config.train.steps,
                     "flops_per_step": flops, "tokens_per_step": tokens,
                     "flops_per_token": flops / tokens,
                     "shape": f"d_model {m.d_model}, {m.num_layers} layers, {m.num_heads} "
                              f"heads × {m.head_dim}, seq {config.data.seq_len}, batch "
                              f"{config.train.batch_size}, {config.train.steps} steps"}
    return out


def uptime() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return bench.loadavg()


def is_loaded(label: str, cores: int) -> bool:
    """`--load_label`: auto calls a machine busy whose 1-minute load exceeds half its cores."""
    if label != "auto":
        return label == "loaded"
    return float(bench.loadavg().split()[0]) > cores / 2


def default_out(cpu_model: str, cores: int, loaded: bool, quick: bool) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_model.lower()).strip("-")
    suffix = "_quick" * quick + "_LOADED" * loaded
    name = f"arrangements_{slug}_{cores}core_{datetime.date.today().isoformat()}{suffix}.json"
    return os.path.join(RESULTS, name)


def best_lines(rows: list[dict]) -> list[str]:
    """Per shape: today's default, the best arrangement the sweep can run, the best of all,
    and PyTorch's best, by runs per hour."""
    lines = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape]
        jax_rows = [r for r in mine if r["side"] == "jax"]
        default = max((r for r in jax_rows if (r["processes"], r["threads"]) == (1, 0)
                       and r["program"] in ("solo", "map")), key=lambda r: r["members"])
        runnable = max((r for r in jax_rows if r["runnable"]), key=lambda r: r["runs_per_hour"])
        best = max(jax_rows, key=lambda r: r["runs_per_hour"])
        torch = max((r for r in mine if r["side"] == "torch"), key=lambda r: r["runs_per_hour"],
                    default=None)
        line = (f"{shape}: default {default['runs_per_hour']:.0f} runs/h; best the sweep runs "
                f"{label(runnable)} {runnable['runs_per_hour']:.0f} "
                f"(×{runnable['runs_per_hour'] / default['runs_per_hour']:.2f}); best measured "
                f"{label(best)} {best['runs_per_hour']:.0f}")
        if torch is not None:
            line += (f"; PyTorch {label(torch)} {torch['runs_per_hour']:.0f} (project/PyTorch "
                     f"{runnable['runs_per_hour'] / torch['runs_per_hour']:.2f})")
        lines.append(line)
    return lines


def label(row: dict) -> str:
    threads = f"×{row['threads']}t" if row["threads"] else " unpinned"
    no_ynn = " noYNN" if row.get("xla_flags") == arrangements.NO_YNN else ""
    return (f"{row['side']} {row['processes']}p{threads}{no_ynn} K={row['members']} "
            f"{row['program']}")


def show(table: dict) -> None:
    print(f"{'shape':<13} {'arrangement':<28} {'run-steps/s':>11} {'GFLOP/s':>8} {'MFU':>5} "
          f"{'runs/h steps':>12} {'runs/h':>8} {'sweep':>5}")
    for row in sorted(table["entries"], key=lambda r: (r["shape"], -r["runs_per_hour"])):
        print(f"{row['shape']:<13} {label(row):<28} {row['run_steps_per_s']:>11.2f} "
              f"{row['gflops']:>8.1f} {row['mfu']:>5.2f} {row['runs_per_hour_steps_only']:>12.0f}"
              f" {row['runs_per_hour']:>8.0f} {'yes' if row['runnable'] else '':>5}")
    print("\n".join(table["best"]))
    print(f"peaks (GFLOP/s): {table['matmul_peak_gflops']}; {table['uptime_before']} -> "
          f"{table['uptime_after']}")


def compare(args) -> dict:
    """Every arrangement at every shape, `--rounds` times; the table."""
    model, cores = arrangements.machine()
    table = {"kind": "cpu_arrangements", "cpu_model": model, "cores": cores,
             "date": datetime.date.today().isoformat(),
             "command": " ".join(["python -m benchmarks.arrangements", *args.given]),
             "machine": bench.machine(), "loaded": args.loaded, "quick": args.quick,
             "uptime_before": uptime(), "window_s": args.window, "rounds": args.rounds}
    peak_before = peaks(cores, min(1.0, args.window))
    shapes = shapes_of(args.shapes, args.quick)
    rounds = []
    for round_index in range(args.rounds):
        rows = []
        order = args.shapes if round_index % 2 == 0 else args.shapes[::-1]
        for shape in order:
            for side, processes, threads, xla_flags in families(cores, args.processes):
                if side == "torch" and not args.torch:
                    continue
                rows += step_rows(shape, side, processes, threads, xla_flags, args)
                print(f"  round {round_index} {shape} {side} {processes}p×{threads or 'all'}"
                      f"{' noYNN' * bool(xla_flags)} ({uptime()})", flush=True)
        rounds.append(rows)
    rows = median_rows(rounds)
    peak_after = peaks(cores, min(1.0, args.window))
    table["matmul_peak_gflops"] = {k: statistics.median([peak_before[k], peak_after[k]])
                                   for k in peak_before}
    table["matmul_peak_rounds"] = [peak_before, peak_after]
    annotate(rows, shapes, table["matmul_peak_gflops"]["xla_all_cores"])
    table["overheads"] = overhead_rows(shapes, rows, args)
    runs_per_hour(rows, table["overheads"], shapes)
    table.update(shapes=shapes, entries=rows, best=best_lines(rows), uptime_after=uptime())
    return table


def parse(argv: list[str]) -> argparse.Namespace:
    cores = os.cpu_count() or 1
    p = _Parser(prog="python -m benchmarks.arrangements", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"from {list(SHAPES)}")
    p.add_argument("--members", default="1,2,4,8,16", help="K: runs a program")
    p.add_argument("--processes", default=f"1,{cores}", help="P: processes (divide the cores)")
    p.add_argument("--window", type=float, default=5.0, help="seconds timed per measurement")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no_torch", dest="torch", action="store_false", help="JAX only")
    p.add_argument("--quick", action="store_true", help="the studies' quick variants: tests")
    p.add_argument("--load_label", choices=("auto", "idle", "loaded"), default="auto",
                   help="auto: loaded when the 1-minute load exceeds half the cores")
    p.add_argument("--out", default=None, help="default: benchmarks/results/arrangements_...")
    p.add_argument("--worker", default=None, help="(internal) one worker's JSON spec")
    args = p.parse_args(argv)
    args.given, args.cores = argv, cores
    try:
        args.members = sorted({int(k) for k in args.members.split(",") if k.strip()})
        args.processes = sorted({int(k) for k in args.processes.split(",") if k.strip()})
    except ValueError:
        p.error("--members and --processes want comma-separated integers")
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if bad := [s for s in args.shapes if s not in SHAPES]:
        p.error(f"--shapes: unknown {bad}; choose from {list(SHAPES)}")
    if not args.members or min(args.members) < 1 or 1 not in args.members:
        p.error(f"--members wants positive K including 1, got {args.members}")
    if bad := [n for n in args.processes if n < 1 or cores % n]:
        p.error(f"--processes: {bad} do not divide this machine's {cores} cores")
    if 1 not in args.processes:
        args.processes.insert(0, 1)  # today's default is one process
    if args.rounds < 1 or args.window < 0:
        p.error("--rounds must be >= 1 and --window >= 0")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if args.torch and not _has_torch():
        print("note: torch is not installed: JAX only (pip install -e '.[reference]')",
              file=sys.stderr)
        args.torch = False
    model, cores = arrangements.machine()
    args.loaded = is_loaded(args.load_label, cores)
    out = args.out or default_out(model, cores, args.loaded, args.quick)
    table = compare(args)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(table, f, indent=2)
    show(table)
    print(f"wrote {out}" + (" (LOADED: the sweep does not read it)" if args.loaded else ""))
    return 0


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main(sys.argv[1:]))
