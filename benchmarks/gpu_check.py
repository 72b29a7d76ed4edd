r"""Accelerator check in one short script (run through benchmarks/gpu_check.sh), under five
minutes on one H200; `python -m benchmarks.gpu_check --tiny` runs every part on tiny models in
seconds, on a CPU too, so that the script is known to work before a device is lent.

1. The fused path (cuDNN on NVIDIA GPUs) agrees with the reference path in bfloat16 for every
   scalar policy and the learned ones, causal, forward and gradients.
2. A 100-step bfloat16 run of experiments/base.py trains (loss falls, status completed).
3. Tokens/s and MFU of the benchmark config (benchmarks/run.py's definitions).
4. The device's idle fraction between steps in the training loop: 1 - (step time with steps
   queued back to back, the device never waiting) / (the period of a step in `train.train`'s
   loop, from time stamps a hook takes at every step). Near 0: the host keeps the device fed.
   Once with one step per program and once with eight (`train.steps_per_call`); then the
   loop's host time per step by part (batch, dispatch, metrics transfer).
5. Ensemble throughput: tokens/s of one program of K = 1, 2, 4, 8, 16 members of the
   accelerator base model (experiments/base.py:gpu), as the sweep's runner trains them; the
   target is K members at >= 0.8·K × one member's tokens/s until the chip is full.
6. MFU of a GPT-2-small-sized model: d_model 768, 12 layers, 12 heads × 64, sequence 1024,
   bfloat16, fused (cuDNN) attention.
7. The sweep runner on a slice of dk_sweep.py:quick with 1 and 8 steps per program.
8. The throughput table (`benchmarks.throughput`) that `--plan` reads: 5 and 6.
Runs on a CPU too (the fused path is then XLA's). Throughput is timed on synthetic bytes and the
training check reads the embedded plays: nothing here needs the network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

from benchmarks import run as bench
from benchmarks import throughput
from scale_ablation.model import attention, policies
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import ensemble, hooks, run_setup, train
from scale_ablation.training import experiment_files as experiment

POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1", "gain_aware:2",
            "learned", "learned_per_head", "log_length", "qk_layernorm", "qk_rmsnorm")
# bf16 keeps 8 significant bits, so one ulp at 1 is 2⁻⁷; two bf16 kernels that round q·s,
# the logits and the probabilities at different points differ by a few ulps. Allow 8.
TOLERANCE = 8 * 2.0**-7


def check_fused(head_dim: int = 64, specs: tuple[str, ...] = POLICIES) -> dict[str, float]:
    keys = jax.random.split(jax.random.key(0), 4)
    shape = (4, 128, 4, head_dim)
    q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys[:3])
    errors = {}
    for spec in specs:
        policy = policies.get(spec)
        params = jax.tree.map(lambda p: p * 1.1, policy.init(keys[3], num_heads=4,
                                                                head_dim=head_dim))

        def loss(q, k, v, params, implementation, policy=policy):
            out = attention.attend(q, k, v, policy=policy, params=params,
                                   implementation=implementation)
            return out.astype(jnp.float32).sum(), out

        results = {impl: jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True),
                                 static_argnums=4)(q, k, v, params, impl)
                   for impl in ("reference", "fused")}
        (_, out_ref), grads_ref = results["reference"]
        (_, out_fused), grads_fused = results["fused"]
        diff = float(jnp.abs(out_ref.astype(jnp.float32) - out_fused.astype(jnp.float32)).max())
        grad_diff = max(
            float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max()
                  / (jnp.abs(a.astype(jnp.float32)).max() + 1e-6))
            for a, b in zip(jax.tree.leaves(grads_ref), jax.tree.leaves(grads_fused), strict=True)
        )
        errors[spec] = max(diff, grad_diff)
        print(f"fused vs reference  {spec:<18} out {diff:.2e}  grads (relative) {grad_diff:.2e}",
              flush=True)
    return errors


def check_training(steps: int = 100, variant: str = "") -> dict:
    config = experiment.load_config("experiments/base.py" + (f":{variant}" if variant else ""))
    config = experiment.apply_overrides(config, {
        "train.steps": steps, "train.dtype": "bfloat16", "train.log_every": max(1, steps // 4),
        "train.eval_every": steps, "train.diag_every": max(1, steps // 2), "checkpoint.every": 0,
        "wandb.mode": "disabled",
        "model.attention_impl": "fused" if jax.devices()[0].platform != "cpu" else "reference",
    })
    with tempfile.TemporaryDirectory() as workdir:
        summary = train.train(config, workdir)
        first = next(row for row in RunFiles(workdir).read_metrics()
                     if "train/loss" in row)
    print(f"bf16 run: {summary['status']}, train loss {first['train/loss']:.3f} at step "
          f"{first['step']} -> {summary['final_train_loss']:.3f} at step {steps}", flush=True)
    return {"summary": summary, "first_logged_loss": first["train/loss"]}


def device_idle_fraction(config=None, steps: int = 64, queued: int = 20,
                         steps_per_call: int = 1) -> dict:
    """How long the device waits on the host per step of the real loop (see the docstring),
    running `steps_per_call` steps per program (`steps` a multiple of it, so that no program of
    another length compiles among the timed steps); the benchmark config unless `config` is
    given."""
    config = experiment.apply_overrides(config or bench.benchmark_config(),
                                        {"train.steps_per_call": steps_per_call})
    step, state, batch = bench.make_stepper(config)
    key = jax.random.key(0)
    for _ in range(3):  # compile and warm up
        state, metrics = step(state, batch, key)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(queued):
        state, metrics = step(state, batch, key)
    jax.block_until_ready(metrics)
    busy = (time.perf_counter() - start) / queued
    loop_step = _loop_step_seconds(config, steps)
    idle = max(0.0, 1.0 - busy / loop_step)
    print(f"device idle between steps, {steps_per_call} per program: {idle:.1%} (queued step "
          f"{busy * 1e3:.2f} ms, loop step {loop_step * 1e3:.2f} ms)", flush=True)
    return {"idle_fraction": idle, "queued_step_s": busy, "loop_step_s": loop_step}


def host_seconds_per_step(config=None, reps: int = 50) -> dict[str, float]:
    """Where the loop's host time per step goes, each part timed alone (median of `reps`):
    the batch (host rows and transfer call), the step's dispatch, and, with the step done, the
    transfer of its metrics. Their sum near the loop's period means the host bounds the loop."""
    config = experiment.apply_overrides(config or bench.benchmark_config(), {
        "checkpoint.every": 0, "wandb.mode": "disabled"})
    with tempfile.TemporaryDirectory() as workdir:
        run = run_setup.prepare(config, workdir)
        axis = ensemble.MemberAxis([run], donate=False)
        state, sources = run.take_state(), [run.source]
        _, metrics = axis.step(state, axis.batch(sources, 0))  # compile
        jax.block_until_ready(metrics)
        parts: dict[str, list[float]] = {"batch": [], "dispatch": [], "metrics": []}
        for step in range(reps):
            start = time.perf_counter()
            batch = axis.batch(sources, step)
            parts["batch"].append(time.perf_counter() - start)
            start = time.perf_counter()
            _, metrics = axis.step(state, batch)
            parts["dispatch"].append(time.perf_counter() - start)
            jax.block_until_ready(metrics)
            start = time.perf_counter()
            jax.device_get(metrics)
            parts["metrics"].append(time.perf_counter() - start)
        run.checkpoints.close()
    medians = {name: statistics.median(times) for name, times in parts.items()}
    print("host time per step: " + ", ".join(f"{name} {seconds * 1e3:.2f} ms"
                                             for name, seconds in medians.items()), flush=True)
    return medians


def _loop_step_seconds(config, steps: int) -> float:
    """The mean period of a step in `train.train`'s loop: time stamps taken by a hook at every
    step (the first eight, with compilation, and the last, with the evaluation, left out). A
    mean, since with several steps per program a chunk's hooks run back to back."""
    config = experiment.apply_overrides(config, {  # the config's own logging interval
        "train.steps": steps, "train.eval_every": steps, "train.diag_every": 0,
        "checkpoint.every": 0, "wandb.mode": "disabled"})
    stamps: list[float] = []
    stamp = hooks.Periodic(1, lambda member, tick: stamps.append(time.perf_counter()),
                           reads_state=False)
    with tempfile.TemporaryDirectory() as workdir:
        train.train(config, workdir, extra_hooks=[stamp], progress=False)
    timed = stamps[8:-1]
    return (timed[-1] - timed[0]) / (len(timed) - 1)


KS = (1, 2, 4, 8, 16)
TINY_KS = (1, 2)
GPT2_SMALL = {"model.d_model": 768, "model.num_layers": 12, "model.num_heads": 12,
              "model.head_dim": 64, "data.seq_len": 1024, "train.batch_size": 16}
TINY_GPT2 = {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 2,
             "model.head_dim": 32, "data.seq_len": 64, "train.batch_size": 4}
ENSEMBLE_SECONDS = 150  # members beyond what fits in this much of the check are left out


def model_config(overrides: dict | None = None, tiny: bool = False):
    """The accelerator base model (base.py:gpu; tiny: base.py:quick) with `overrides`,
    bfloat16 and fused attention on an accelerator, reading nothing from the hub."""
    config = experiment.load_config("experiments/base.py:" + ("quick" if tiny else "gpu"))
    accelerator = jax.devices()[0].platform != "cpu"
    return experiment.apply_overrides(config, {
        "data.source": "shakespeare", "wandb.mode": "disabled", **(overrides or {}),
        "train.dtype": "bfloat16" if accelerator or not tiny else "float32",
        "model.attention_impl": "fused" if accelerator else "reference"})


def ensemble_throughput(tiny: bool, peak_flops: float) -> list[dict]:
    """Tokens/s of K members in one program, K = 1, 2, 4, 8, 16 (tiny: 1, 2), until one does
    not fit in memory or the time given to this part is spent."""
    config, start, entries = model_config(tiny=tiny), time.perf_counter(), []
    for k in TINY_KS if tiny else KS:
        if entries and time.perf_counter() - start > ENSEMBLE_SECONDS:
            print(f"ensemble K={k}: left out (this part's {ENSEMBLE_SECONDS} s are spent)")
            break
        try:
            figures = throughput.members_figures(config, k)
        except Exception as error:  # XlaRuntimeError RESOURCE_EXHAUSTED: the chip is full
            print(f"ensemble K={k}: failed, {type(error).__name__}: {str(error)[:200]}")
            break
        entries.append(throughput.entry("accelerator base model", figures, peak_flops))
        one = entries[0]["tokens_per_s"]
        print(f"ensemble K={k:<2} {figures['tokens_per_s']:>12,.0f} tokens/s  "
              f"{figures['tokens_per_s'] / (k * one):.2f} of K × one member's  MFU "
              f"{entries[-1]['mfu']:.3f}  peak {(figures['peak_bytes'] or 0) / 2**30:.2f} GiB",
              flush=True)
    return entries


def gpt2_small_mfu(tiny: bool, peak_flops: float) -> dict:
    config = model_config(TINY_GPT2 if tiny else GPT2_SMALL, tiny=tiny)
    figures = throughput.members_figures(config, 1)
    found = throughput.entry("GPT-2-small-sized", figures, peak_flops)
    print(f"GPT-2-small-sized ({throughput.describe(config)}): {figures['tokens_per_s']:,.0f} "
          f"tokens/s, MFU {found['mfu']:.3f} of {peak_flops / 1e9:,.0f} GFLOP/s", flush=True)
    return found


SLICE = """from experiments import dk_sweep
def get_config(arg=None):
    config = dk_sweep.get_config("quick")
    config.train.steps_per_call = {steps_per_call}
    config.train.steps = {steps}
    config.train.log_every = config.train.eval_every = config.train.diag_every = {steps} // 2
    config.checkpoint.every = {steps}
    config.wandb.mode = "disabled"
    return config
def sweep(arg=None):
    return [p for p in dk_sweep.sweep("quick") if p["model.init"] == "fan_in"
            and p["policy"] in ("inv_sqrt_dk", "none")][:{points}]
"""


def sweep_figures(steps_per_call: int, tiny: bool) -> dict:
    """Wall seconds of `scale_ablation.sweep` (a fresh process, a cold compilation cache) on a
    slice of dk_sweep.py:quick with `steps_per_call` steps per program, and what it compiled."""
    steps, points = (16, 1) if tiny else (120, 4)
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "slice.py")
        with open(spec, "w") as f:
            f.write(SLICE.format(steps_per_call=steps_per_call, steps=steps, points=points))
        env = {**os.environ, "WANDB_MODE": "disabled"}
        seconds, compiled = bench._timed_sweep(spec, os.path.join(tmp, "sweep"), env)
    print(f"sweep of {points} dk_sweep:quick runs ({steps} steps), {steps_per_call} per "
          f"program: {seconds:.1f} s, {compiled.get('compile_seconds', float('nan')):.1f} s "
          "compiling", flush=True)
    return {"steps_per_call": steps_per_call, "seconds": seconds, **compiled}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny models: seconds, any device")
    parser.add_argument("--out_dir", default=os.path.join("benchmarks", "results"),
                        help="where the throughput table goes")
    args = parser.parse_args(argv)
    tiny, started = args.tiny, time.perf_counter()
    print(json.dumps(bench.machine()), flush=True)
    errors = check_fused(16, POLICIES[:3]) if tiny else check_fused()
    run = check_training(10, "quick") if tiny else check_training()
    peak_flops, peak_source = throughput.peak(jax.devices()[0].device_kind)
    entries = [*ensemble_throughput(tiny, peak_flops), gpt2_small_mfu(tiny, peak_flops)]
    idle_config = bench.benchmark_config(tiny=tiny)
    idle = {n: device_idle_fraction(idle_config, queued=4 if tiny else 20, steps_per_call=n)
            for n in (1, 8)}
    host_seconds_per_step(idle_config, reps=5 if tiny else 50)
    sweeps = [sweep_figures(n, tiny) for n in (1, 8)]
    path = throughput.write_table(entries, args.out_dir, peak_flops, peak_source, extra={
        "idle": idle, "sweeps": sweeps, "tiny": tiny})
    print(f"wrote {path} (MFU against {peak_source}); {time.perf_counter() - started:.0f} s")
    failed = [spec for spec, err in errors.items() if not err <= TOLERANCE]
    trained = (run["summary"]["status"] == "completed"
               and run["summary"]["final_train_loss"] < run["first_logged_loss"])
    print(f"RESULT fused_agrees={not failed} trains={trained}"
          + (f" failed_policies={failed}" if failed else ""), flush=True)
    return 0 if not failed and trained else 1


if __name__ == "__main__":
    sys.exit(main())
