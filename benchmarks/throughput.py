r"""Tokens/s of the runner's train-step programs, and the throughput table the planner reads.

`members_figures` times the program a sweep trains K runs with (`steps.Programs.train_members`:
vmapped on an accelerator, the members in turn on a CPU (`steps.over_members`); K = 1 is the
solo program) on synthetic bytes, so no corpus is needed: the step's cost does not depend on
the bytes. `write_table` writes `throughput_<device kind>.json`:

  {"device_kind", "date", "peak_flops", "peak_source", "matmul_flops",
   "entries": [{"name", "members", "shape", "flops_per_token", "tokens_per_s", "mfu",
                "peak_bytes"}, ...]}

`flops_per_token` is `provenance.flops_per_token` (training, causal attention halved), the
count `scale_ablation.sweeping.planner` multiplies by tokens; `tokens_per_s` counts every
member's tokens; `mfu` is their product over `peak_flops` (the spec sheet's dense bf16 peak on
an accelerator, a float32 matmul measured in this process on a CPU); `peak_bytes` is XLA's
memory analysis of the compiled program on this device.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from scale_ablation.sweeping import planner
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import provenance, run_config, run_setup, steps
from scale_ablation.training.optim import OptimizerSettings


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)  # (K, ...)


def members_program(config, members: int):
    """(compiled program, state, batch, seeds) of `members` runs of `config` (seeds 0..K-1)
    stepping together as the sweep's runner steps them, and the program's peak bytes."""
    states = []
    for seed in range(members):
        graphdef, state = run_setup.init_state(experiment.apply_overrides(config,
                                                                          {"train.seed": seed}))
        states.append(state)
    settings = OptimizerSettings.of(config)
    programs = steps.programs(graphdef, settings, float(config.train.z_loss))
    shape = (config.train.batch_size, config.data.seq_len)
    rng = np.random.default_rng(0)  # synthetic bytes: a step's cost does not depend on them
    rows = [{"inputs": rng.integers(0, 256, shape, np.int32),
             "targets": rng.integers(0, 256, shape, np.int32),
             "weights": np.ones(shape, np.float32)} for _ in range(members)]
    if members == 1:
        state, batch, seeds, program = states[0], rows[0], jnp.int32(0), programs.train
    else:
        state, batch = _stack(states), _stack(rows)
        seeds, program = jnp.arange(members, dtype=jnp.int32), programs.train_members
    batch = jax.device_put(batch)
    compiled = program.lower(state, batch, seeds).compile()
    stats = compiled.memory_analysis()
    peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes
            + stats.temp_size_in_bytes - stats.alias_size_in_bytes) if stats else None
    return compiled, state, batch, seeds, peak


def members_figures(config, members: int, reps: int = 5) -> dict:
    """Tokens/s (all members), MFU and peak bytes of one program of `members` runs."""
    compiled, state, batch, seeds, peak = members_program(config, members)
    for _ in range(2):  # warm-up
        state, metrics = compiled(state, batch, seeds)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch, seeds)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    model = run_config.model_config(config)
    counts = planner._parameter_counts(model)
    per_token = provenance.flops_per_token(model, counts["non_embedding_parameters"],
                                           config.data.seq_len)
    tokens = members * config.train.batch_size * config.data.seq_len
    return {"members": members, "step_seconds": seconds, "tokens_per_s": tokens / seconds,
            "flops_per_token": per_token, "peak_bytes": peak,
            "shape": {k: v for k, v in planner.shape_of(config)}}


def peak(device_kind: str) -> tuple[float, str]:
    """The FLOP/s MFU is reported against: the planner's spec-sheet peak for a named
    accelerator, a float32 matmul measured here otherwise."""
    try:
        known = planner.device(device_kind)
    except ValueError:
        known = planner.device("cpu")
    return known.peak_flops, known.peak_source


def entry(name: str, figures: dict, peak_flops: float) -> dict:
    return {"name": name, **figures,
            "mfu": figures["tokens_per_s"] * figures["flops_per_token"] / peak_flops}


def describe(config) -> str:
    return ", ".join(f"{k} {v}" for k, v in planner.shape_of(config))


def write_table(entries: list[dict], out_dir: str, peak_flops: float, source: str,
                extra: dict | None = None) -> str:
    """throughput_<device kind>.json in `out_dir` (with `extra`'s keys); its path. `peak_flops`
    is the one the entries' MFU was computed against."""
    kind = jax.devices()[0].device_kind
    table = {"device_kind": kind, "date": datetime.date.today().isoformat(),
             "peak_flops": peak_flops, "peak_source": source,
             "matmul_flops": planner.matmul_flops(), **(extra or {}), "entries": entries}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"throughput_{kind.replace(' ', '_')}.json")
    with open(path, "w") as f:
        json.dump(table, f, indent=2)
    return path
