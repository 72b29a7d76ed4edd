r"""Measure what a sweep costs: `python -m benchmarks.run [--quick] [--out FILE.json]`.

Prints a table and writes JSON with:
  matmul_peak_gflops        a large jitted matmul here (float32 on CPU, bf16 on accelerators):
                            the reference for MFU, measured in this process
  train_tokens_per_s        the benchmark config's train step (d_model 256, 4 layers,
  train_mfu                 4 heads × 64, seq 256, batch 16); model FLOPs per token as in PaLM
                            appendix B, 6·N + 12·L·H·Q·T, without causal halving
  attention_overhead_ratio  step time with the policy attention (inv_sqrt_dk) over the same
                            model calling jax.nn.dot_product_attention directly (default scale)
  ensemble_k, ensemble_speedup[_tiny]
                            K members differing in seed and learning rate as one program,
                            against the same K stepped one after another: vmapped on an
                            accelerator, `lax.map` on a CPU (both kinds in *_detail)
  sweep_speedup             dk_sweep.py:quick run naively (a fresh process per run, no
                            compilation cache) over the default in-process runner, cold (--quick:
                            a 6-point slice of that grid, stated in the JSON)
  sweep_speedup_warm_cache  the same naive time over the runner rerun in a fresh process, in the
                            same sweep directory with its runs removed and its compilation cache
  compile_seconds_share     the cold runner's tracing, lowering and XLA seconds (its own count,
                            `[sweep] compiled ...`; the compile-ahead thread's overlap training)
                            over its wall time
  compile_waited_share      the same without the compile-ahead thread's seconds: the
                            compilation the training waited for
  host_sync_ratio           step time fetching every step's metrics before the next step over
                            fetching them one step late (the pipelined loop); ~1 on a CPU, where
                            the host and the "device" are the same cores
  loadavg_before/_after     /proc/loadavg: timings from a loaded machine say so
  scalar_policy_compiles    train-step compilations for runs through six scalar policies at
                            one d_k in one process
Timings exclude warm-up, repeat several times and report the median, blocked on results.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from scale_ablation.data import sources as data
from scale_ablation.model import attention
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import optim, run_setup, steps, train

_QUICK = flags.DEFINE_bool("quick", False, "Fewer repetitions and a 6-point sweep slice.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
_ENSEMBLE_K = flags.DEFINE_integer("ensemble_k", 8, "Members of the vmapped ensemble.")
PARTS = ("step", "ensemble", "host_sync", "sweep")
_ONLY = flags.DEFINE_list("only", [], f"Measure only these parts (default all): {PARTS}.")

SCALAR_POLICIES = ("none", "inv_sqrt_dk", "inv_dk", "inv_log_dk", "const:0.1", "gain_aware:2")


def median_seconds(fn, *, warmup: int = 2, reps: int = 7) -> float:
    """Median wall time of `fn()` (which must return something to block on)."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak_gflops(reps: int) -> float:
    accelerator = jax.devices()[0].platform != "cpu"
    n = 8192 if accelerator else 2048
    dtype = jnp.bfloat16 if accelerator else jnp.float32
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    matmul = jax.jit(jnp.matmul)
    return 2 * n**3 / median_seconds(lambda: matmul(a, b), reps=reps) / 1e9


def benchmark_config(tiny: bool = False):
    config = experiment.load_config("experiments/base.py")
    m, t = config.model, config.train
    if tiny:
        m.d_model, m.num_layers, m.num_heads, m.head_dim = 64, 2, 2, 32
        config.data.seq_len, t.batch_size = 64, 8
    else:
        m.d_model, m.num_layers, m.num_heads, m.head_dim = 256, 4, 4, 64
        config.data.seq_len, t.batch_size = 256, 16
    if jax.devices()[0].platform != "cpu":
        t.dtype, m.attention_impl = "bfloat16", "fused"
    return config


def flops_per_token(config, num_params: int) -> float:
    """PaLM appendix B: 6·N + 12·L·H·Q·T (no causal halving)."""
    m = config.model
    return 6 * num_params + 12 * m.num_layers * m.num_heads * m.head_dim * config.data.seq_len


def make_stepper(config, *, seed: int = 0):
    """A jitted train step, its initial state and a fixed batch (host data cost excluded)."""
    config = experiment.apply_overrides(config, {"train.seed": seed})
    tx = optim.make_optimizer(config)
    graphdef, state = run_setup.init_state(config, tx)
    step = jax.jit(steps.make_train_step(graphdef, tx, 0.0), donate_argnums=0)
    source = data.make_source(config.data, seed=seed)
    raw = source.train_batch(0, config.train.batch_size, config.data.seq_len)
    batch = {name: jnp.asarray(getattr(raw, name)) for name in ("inputs", "targets", "weights")}
    return step, state, batch


def step_seconds(config, reps: int) -> tuple[float, int]:
    step, state, batch = make_stepper(config)
    num_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    key = jax.random.key(0)
    holder = {"state": state}

    def one():
        holder["state"], metrics = step(holder["state"], batch, key)
        return metrics["train/loss"]

    return median_seconds(one, reps=reps), num_params


@contextlib.contextmanager
def direct_dot_product_attention():
    """Swap the policy attention for a bare jax.nn.dot_product_attention call."""
    original = attention.attend

    def attend(q, k, v, **kwargs):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    attention.attend = attend
    try:
        yield
    finally:
        attention.attend = original


def attention_overhead_ratio(config, reps: int) -> float:
    """Policy attention vs direct jax.nn.dot_product_attention, timed alternately."""
    key = jax.random.key(0)
    steppers, states = {}, {}
    steppers["policy"] = make_stepper(config)
    with direct_dot_product_attention():  # traced (first call) while the swap is in place
        steppers["direct"] = make_stepper(config)
        step, state, batch = steppers["direct"]
        states["direct"], _ = jax.block_until_ready(step(state, batch, key))
    states["policy"] = steppers["policy"][1]
    timings = {"policy": [], "direct": []}
    for repeat in range(reps + 2):  # the first two rounds are warm-up
        for name in ("policy", "direct"):
            step, _, batch = steppers[name]
            start = time.perf_counter()
            states[name], metrics = step(states[name], batch, key)
            jax.block_until_ready(metrics)
            if repeat >= 2:
                timings[name].append(time.perf_counter() - start)
    return statistics.median(timings["policy"]) / statistics.median(timings["direct"])


def ensemble_speedup(config, k: int, reps: int) -> dict:
    """K members (seeds and learning rates differ) vmapped vs one after another."""
    members = [make_stepper(config, seed=i) for i in range(k)]
    single = members[0][0]
    states = [{**state, "lr": state["lr"] * (1.0 + 0.1 * i)}
              for i, (_, state, _) in enumerate(members)]
    batches = [batch for _, _, batch in members]
    key = jax.random.key(0)

    def stack(trees):
        return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)  # (K, ...)

    # Stacked copies first: the sequential loop donates the per-member states.
    holder = {"ensemble": stack(states), "sequential": states}
    ensemble_batch, keys = stack(batches), jax.random.split(key, k)
    tx = optim.make_optimizer(config)
    graphdef, _ = run_setup.init_state(config, tx)
    step = steps.make_train_step(graphdef, tx, 0.0)
    vmapped = jax.jit(jax.vmap(step), donate_argnums=0)
    # One program that steps the members in turn: on a CPU, whose matmuls are compute-bound
    # already, this beats vmap (whose batched matmuls run slower there).
    mapped = jax.jit(lambda s, b, k: jax.lax.map(lambda a: step(*a), (s, b, k)),
                     donate_argnums=0)
    holder["mapped"] = stack(states)

    def sequential():
        out = None
        for i in range(k):
            holder["sequential"][i], out = single(holder["sequential"][i], batches[i], key)
        return out["train/loss"]

    def ensemble():
        holder["ensemble"], metrics = vmapped(holder["ensemble"], ensemble_batch, keys)
        return metrics["train/loss"]

    def one_program():
        holder["mapped"], metrics = mapped(holder["mapped"], ensemble_batch, keys)
        return metrics["train/loss"]

    seconds_sequential = median_seconds(sequential, reps=reps)
    seconds_vmap = median_seconds(ensemble, reps=reps)
    seconds_map = median_seconds(one_program, reps=reps)
    return {"sequential_s": seconds_sequential, "vmap_s": seconds_vmap, "map_s": seconds_map,
            "vmap_speedup": seconds_sequential / seconds_vmap,
            "map_speedup": seconds_sequential / seconds_map}


def scalar_policy_compiles(config) -> int:
    """Train-step compilations for in-process runs through six scalar policies at one d_k."""
    before = steps.train_step_compilations()
    tmp = tempfile.mkdtemp()
    try:
        for spec in SCALAR_POLICIES:
            run_config = experiment.apply_overrides(config, {
                "policy": spec, "train.steps": 3, "train.log_every": 0, "train.eval_every": 0,
                "train.diag_every": 0, "checkpoint.every": 0, "wandb.mode": "disabled",
            })
            train.train(run_config, os.path.join(tmp, spec))
        return steps.train_step_compilations() - before
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def host_sync(config, reps: int, steps_per_rep: int = 8) -> dict:
    """Seconds per train step when each step's metrics are fetched before the next step is
    dispatched (the loop before pipelining) and when they are fetched one step late (the
    pipelined loop); the same non-donating program for both."""
    config = experiment.apply_overrides(config, {"train.seed": 0})
    tx = optim.make_optimizer(config)
    graphdef, state = run_setup.init_state(config, tx)
    step = jax.jit(steps.make_train_step(graphdef, tx, 0.0))
    _, _, batch = make_stepper(config)
    key = jax.random.key(0)
    holder = {"state": state}

    def run(pipelined: bool):
        pending = None
        for _ in range(steps_per_rep):
            holder["state"], metrics = step(holder["state"], batch, key)
            if pending is not None:
                jax.device_get(pending)
            pending = metrics
            if not pipelined:
                jax.device_get(pending)
                pending = None
        return holder["state"]["step"]

    synced = median_seconds(lambda: run(False), reps=reps) / steps_per_rep
    pipelined = median_seconds(lambda: run(True), reps=reps) / steps_per_rep
    return {"fetch_every_step_s": synced, "fetch_one_step_late_s": pipelined,
            "ratio": synced / pipelined}


COMPILE_LINE = re.compile(r"\[sweep\] compiled (\d+) programs \((\d+) train steps, (\d+) of "
                          r"them ahead\), (\d+) loaded from the compilation cache, "
                          r"([0-9.]+) s compiling \(([0-9.]+) s not ahead\)")


def _timed_sweep(spec: str, sweep_dir: str, env: dict, *extra: str) -> tuple[float, dict]:
    """Wall seconds of the in-process sweep runner on `spec` (with the sweep flags `extra`),
    and what it compiled."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "scale_ablation.sweep", f"--config={spec}",
         f"--workdir={sweep_dir}", "--report=False", *extra],
        check=True, env=env, capture_output=True, text=True, cwd=os.getcwd())
    seconds = time.perf_counter() - start
    found = COMPILE_LINE.search(result.stdout)
    names = ("programs_compiled", "train_steps_compiled", "train_steps_compiled_ahead",
             "programs_from_cache", "compile_seconds", "compile_seconds_waited")
    compiled = dict(zip(names, (float(g) for g in found.groups()), strict=True)) if found else {}
    return seconds, compiled


SWEEP_SPEC = "experiments/dk_sweep.py:quick"
SWEEP_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def sweep_grid(quick: bool) -> list[dict]:
    """dk_sweep.py:quick's grid; `quick`: two of its policies at its three fan_in cells (six
    runs in three groups: the same mechanism, less time)."""
    grid = experiment.load_grid(SWEEP_SPEC)
    if quick:
        grid = [p for p in grid if p["policy"] in ("inv_sqrt_dk", "none")
                and p.get("model.init") == "fan_in"]
    return grid


def write_grid_slice(directory: str, grid: list[dict]) -> str:
    """An experiment file in `directory` with dk_sweep's config and `grid`; its spec."""
    slice_file = os.path.join(directory, "grid.py")
    with open(slice_file, "w") as f:
        f.write("from experiments import dk_sweep\n"
                f"get_config = dk_sweep.get_config\ndef sweep(arg=None):\n"
                f"    return {grid!r}\n")
    return f"{slice_file}:quick"


def sweep_speedup(quick: bool) -> dict:
    """Naive (fresh process per run, no cache) vs the default runner on the same grid, cold
    (fresh dirs, empty cache) and warm (fresh run dirs, the cold run's compilation cache)."""
    spec, grid = SWEEP_SPEC, sweep_grid(quick)
    env = {**os.environ, **SWEEP_ENV}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        for point in grid:
            subprocess.run(
                [sys.executable, "-m", "scale_ablation.main", f"--config={spec}",
                 f"--workdir={tmp}/naive/{experiment.run_name(point)}",
                 "--config.train.compilation_cache=False", *experiment.override_flags(point)],
                check=True, env=env, capture_output=True)
        naive = time.perf_counter() - start
        sliced = write_grid_slice(tmp, grid)
        sweep_dir = f"{tmp}/runner/sweep"
        runner, cold = _timed_sweep(sliced, sweep_dir, env)
        # The rerun: the same directory without its runs. (The cache must stay where it was:
        # its keys hold its path, through the XLA caches JAX keeps inside it.)
        for entry in os.listdir(sweep_dir):
            if entry != ".jax_cache":
                path = os.path.join(sweep_dir, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        warm, warm_compiled = _timed_sweep(sliced, sweep_dir, env)
    return {"runs": len(grid), "naive_s": naive, "runner_s": runner, "warm_s": warm,
            "speedup": naive / runner, "speedup_warm_cache": naive / warm,
            # Compile seconds include those of the compile-ahead thread, which overlap training.
            "compile_seconds_share": cold.get("compile_seconds", float("nan")) / runner,
            # What training waited for: compilation outside the compile-ahead thread.
            "compile_waited_share": cold.get("compile_seconds_waited", float("nan")) / runner,
            "compiled_cold": cold, "compiled_warm": warm_compiled}


def loadavg() -> str:
    """The 1/5/15-minute load: timings from a loaded machine say so."""
    with contextlib.suppress(OSError), open("/proc/loadavg") as f:
        return f.read().strip()
    return "unknown"


def machine() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if "model name" in line), cpu)
    device = jax.devices()[0]
    return {"platform": device.platform, "device_kind": device.device_kind,
            "device_count": jax.device_count(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "jax": jax.__version__, "date": datetime.date.today().isoformat()}


def main(argv: list[str]) -> int:
    del argv
    quick, only = _QUICK.value, set(_ONLY.value or PARTS)
    unknown = only - set(PARTS)
    if unknown:
        print(f"error: --only: unknown parts {sorted(unknown)}; choose from {PARTS}",
              file=sys.stderr)
        return 2
    reps = 3 if quick else 7
    results: dict = {"machine": machine(), "quick": quick, "loadavg_before": loadavg()}
    config = benchmark_config()
    if "step" in only:
        _step_figures(results, config, reps)
    if "ensemble" in only:
        _ensemble_figures(results, config, reps)
    if "host_sync" in only:
        sync = host_sync(config, reps)
        results["host_sync_ratio"] = sync["ratio"]
        results["host_sync_detail"] = sync
    if "sweep" in only:
        results["scalar_policy_compiles"] = scalar_policy_compiles(benchmark_config(tiny=True))
        sweep = sweep_speedup(quick)
        for name in ("speedup", "speedup_warm_cache"):
            results[f"sweep_{name}"] = sweep[name]
        for name in ("compile_seconds_share", "compile_waited_share"):
            results[name] = sweep[name]
        results["sweep_detail"] = sweep
    results["loadavg_after"] = loadavg()
    _show(results)
    return 0


def step_figures(config, reps: int) -> dict[str, float]:
    """The train step's time, tokens/s and MFU against a matmul peak measured just before."""
    peak = matmul_peak_gflops(reps)
    seconds, num_params = step_seconds(config, reps)
    tokens_per_s = config.train.batch_size * config.data.seq_len / seconds
    flops = flops_per_token(config, num_params)
    return {"matmul_peak_gflops": peak, "train_step_seconds": seconds,
            "train_tokens_per_s": tokens_per_s, "model_flops_per_token": flops,
            "train_mfu": tokens_per_s * flops / (peak * 1e9)}


def _step_figures(results: dict, config, reps: int) -> None:
    results.update(step_figures(config, reps))
    results["attention_overhead_ratio"] = attention_overhead_ratio(config, reps)


def _ensemble_figures(results: dict, config, reps: int) -> None:
    k = _ENSEMBLE_K.value
    results["ensemble_k"] = k
    # The runner's strategy: vmap on accelerators, one mapped program on a CPU.
    strategy = "map_speedup" if jax.devices()[0].platform == "cpu" else "vmap_speedup"
    tiny = ensemble_speedup(benchmark_config(tiny=True), k, reps)
    results["ensemble_speedup_tiny"] = tiny[strategy]
    results["ensemble_detail_tiny"] = tiny
    full = ensemble_speedup(config, k, max(2, reps // 2))
    results["ensemble_speedup"] = full[strategy]
    results["ensemble_detail"] = full


def _show(results: dict) -> None:
    width = max(len(key) for key in results)
    for key, value in results.items():
        if not isinstance(value, dict):
            shown = f"{value:.4g}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {shown}")
    if _OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
        with open(_OUT.value, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    app.run(lambda argv: sys.exit(main(argv)))
