r"""The benchmark model's train step against nanoGPT's in PyTorch, side by side (issue 33):

    python -m benchmarks.vs_pytorch [--seqs=256,1024] [--rounds=3] [--reps=5]
        [--impls=reference,blocked,auto] [--threads=2] [--out FILE.json]

The model is `benchmarks.run.benchmark_config()` (d_model 256, 4 layers, 4 heads × 64, batch 16)
at each sequence length of `--seqs`. The JAX side is `benchmarks.run.make_stepper`'s jitted train
step (forward, backward, clip, AdamW) with `model.attention_impl` set to each `--impls` value.
The PyTorch side is `benchmarks/reference_gpt2.py`'s GPT-2 (nanoGPT's architecture) with
nanoGPT's attention call, `scaled_dot_product_attention(..., is_causal=True)`, float32, eager,
`torch.set_num_threads(--threads)`, stepping zero_grad, forward, cross entropy, backward,
global-norm clip and AdamW. Both are timed by `benchmarks.run.median_seconds` (median of `--reps`
after two warm-up steps).

Each measurement is its own process (`--side=jax|torch --seq=N`, one JSON line on stdout), and
for each sequence the sides alternate for `--rounds` rounds (the order reversed every other
round), so that drift on a shared machine reaches both. A side's step time is the median of its
rounds' medians; the ratio is JAX's over PyTorch's. Each process measures its own float32
2048² matmul peak, and its MFU is tokens/s × `benchmarks.run.flops_per_token` (6·N + 12·L·H·Q·T,
PaLM appendix B, no causal halving: the same formula on both sides, each with its own N) over it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

from benchmarks import run as bench
from scale_ablation.data import sources

IMPLS = ("reference", "fused", "blocked", "auto")  # ModelConfig.check's model.attention_impl
FLOP_COUNT = ("both sides: benchmarks.run.flops_per_token, 6·N + 12·L·H·Q·T per token (PaLM "
              "appendix B, no causal halving), N each side's own parameter count")
ARCHITECTURE = (
    "both: byte vocabulary 256, learned position table of model.max_seq_len rows, pre-LayerNorm "
    "blocks (scale and bias), GELU (tanh) MLP of 4·d_model with biases, final LayerNorm, output "
    "tied to the token embedding, no dropout, float32. Attention biases as the JAX model has "
    "them (only under model.init=gpt2; nanoGPT's default has them). PyTorch projects q, k and v "
    "with three matrices where nanoGPT fuses them into one (c_attn): the same FLOPs. The JAX "
    "step also computes the update and parameter norms and its non-finite guard; PyTorch's "
    "runs eager (nanoGPT's torch.compile is left out). Layer-norm epsilon: 1e-6 against 1e-5.")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's usage block is noise here)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def shape_of(config) -> dict:
    """What the PyTorch side needs to build the same model, from the JAX config."""
    m, t = config.model, config.train
    return {"d_model": m.d_model, "layers": m.num_layers, "heads": m.num_heads,
            "head_dim": m.head_dim, "mlp_ratio": m.mlp_ratio, "max_seq_len": m.max_seq_len,
            "batch": t.batch_size, "attn_bias": m.init == "gpt2",
            "init": "gpt2" if m.init == "gpt2" else "fan_in", "lr": t.lr,
            "weight_decay": t.weight_decay, "clip": t.grad_clip,
            "vocab": sources.vocab_size(config.data)}


def flops_of(shape: dict, seq: int, num_params: int) -> float:
    """benchmarks.run.flops_per_token itself, given the shape as the config fields it reads."""
    model = SimpleNamespace(num_layers=shape["layers"], num_heads=shape["heads"],
                            head_dim=shape["head_dim"])
    return bench.flops_per_token(SimpleNamespace(model=model, data=SimpleNamespace(seq_len=seq)),
                                 num_params)


def _record(side: str, seconds: float, first: tuple[float, float], peak: float, shape: dict,
            seq: int, num_params: int) -> dict:
    tokens_per_s = shape["batch"] * seq / seconds
    flops = flops_of(shape, seq, num_params)
    return {"side": side, "seq": seq, "step_s": seconds, "first_step_s": first[0],
            "loss_step0": first[1], "matmul_peak_gflops": peak, "num_params": num_params,
            "flops_per_token": flops, "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * flops / (peak * 1e9)}


def jax_side(seq: int, impl: str, reps: int, tiny: bool) -> dict:
    """One JAX measurement: the matmul peak, then the benchmark model's train step."""
    import jax

    from scale_ablation.training import experiment_files as experiment

    config = experiment.apply_overrides(bench.benchmark_config(tiny=tiny), {
        "data.seq_len": seq, "model.attention_impl": impl})
    peak = bench.matmul_peak_gflops(reps)
    step, state, batch = bench.make_stepper(config)
    num_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    key = jax.random.key(0)
    start = time.perf_counter()  # the first call compiles
    state, metrics = jax.block_until_ready(step(state, batch, key))
    first = (time.perf_counter() - start, float(metrics["train/loss"]))
    holder = {"state": state}

    def one():
        holder["state"], out = step(holder["state"], batch, key)
        return out["train/loss"]

    seconds = bench.median_seconds(one, reps=reps)
    record = _record("jax", seconds, first, peak, shape_of(config), seq, num_params)
    return {**record, "impl": impl, "version": jax.__version__}


def torch_model(shape: dict):
    """reference_gpt2's GPT-2 at `shape`, its blocks calling the fused causal attention."""
    import torch
    from torch.nn import functional

    from benchmarks import reference_gpt2

    class SdpaBlock(reference_gpt2.Block):
        """nanoGPT's attention: one fused causal call instead of the masked softmax."""

        def attention(self, x):
            b, t, _ = x.shape

            def heads(y):  # (B, T, H*D) -> (B, H, T, D)
                return y.view(b, t, self.heads, self.head_dim).transpose(1, 2)

            out = functional.scaled_dot_product_attention(
                heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True)
            return self.attn_out(out.transpose(1, 2).reshape(b, t, -1))  # (B, T, H*D)

    args = SimpleNamespace(d_model=shape["d_model"], heads=shape["heads"],
                           head_dim=shape["head_dim"], layers=shape["layers"],
                           seq_len=shape["max_seq_len"],  # the position table's rows, as ours
                           no_attn_bias=not shape["attn_bias"], init=shape["init"], std=[],
                           lr=shape["lr"], wd=shape["weight_decay"])
    torch.manual_seed(0)
    model = reference_gpt2.GPT(args)
    for block in model.blocks:  # same parameters, only the attention call differs
        block.__class__ = SdpaBlock
    return model, reference_gpt2.optimizer(model, args), SdpaBlock


def torch_step(model, opt, shape: dict, seq: int):
    """nanoGPT's train step on one fixed batch of random bytes (seed 0): a callable returning
    the loss."""
    import torch
    from torch.nn import functional

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shape["vocab"], (shape["batch"], seq + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, T) each

    def one() -> float:
        logits = model(inputs)  # (B, T, vocab)
        loss = functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), shape["clip"])
        opt.step()
        return loss.item()

    return one


def torch_side(seq: int, reps: int, shape: dict, threads: int) -> dict:
    """One PyTorch measurement: the matmul peak, then nanoGPT's train step at the same shape."""
    import torch

    torch.set_num_threads(threads)
    if (shape["mlp_ratio"], shape["vocab"]) != (4, 256):  # reference_gpt2's: fixed
        raise ValueError(f"the PyTorch model has mlp_ratio 4 and 256 bytes, the JAX one "
                         f"{shape['mlp_ratio']} and {shape['vocab']}")
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    peak = 2 * n**3 / bench.median_seconds(lambda: torch.matmul(a, b), reps=reps) / 1e9
    model, opt, _ = torch_model(shape)
    one = torch_step(model, opt, shape, seq)
    start = time.perf_counter()
    loss0 = one()
    first = (time.perf_counter() - start, loss0)
    seconds = bench.median_seconds(one, reps=reps)
    num_params = sum(p.numel() for p in model.parameters())
    record = _record("torch", seconds, first, peak, shape, seq, num_params)
    return {**record, "impl": "sdpa", "threads": torch.get_num_threads(),
            "version": torch.__version__}


def side_argv(side: str, seq: int, impl: str, args: argparse.Namespace, shape: dict) -> list:
    argv = [sys.executable, "-m", "benchmarks.vs_pytorch", f"--side={side}", f"--seq={seq}",
            f"--reps={args.reps}", f"--threads={args.threads}", f"--impl={impl}",
            f"--shape={json.dumps(shape)}"]
    return argv + (["--tiny"] if args.tiny else [])


def run_side(argv: list) -> dict:
    """One side in a fresh process: its record (the last stdout line) with the load around it."""
    before, start = bench.loadavg(), time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=os.getcwd())
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:5])} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {**record, "process_s": process_s, "loadavg_before": before,
            "loadavg_after": bench.loadavg()}


def measure_seq(seq: int, args: argparse.Namespace, shape: dict) -> list[dict]:
    """`--rounds` rounds of every JAX implementation and PyTorch, alternating."""
    order = [("jax", impl) for impl in args.impls] + [("torch", "sdpa")]
    records = []
    for round_index in range(args.rounds):
        for side, impl in order if round_index % 2 == 0 else order[::-1]:
            record = run_side(side_argv(side, seq, impl, args, shape))
            records.append({**record, "round": round_index})
            print(f"  seq {seq} round {round_index} {side}:{impl} "
                  f"{record['step_s'] * 1e3:.1f} ms (load {record['loadavg_before']})",
                  flush=True)
    return records


def summarise(records: list[dict]) -> dict:
    """Per implementation: the median of its rounds' medians, MFU, and JAX over PyTorch."""
    by_impl: dict[str, list[dict]] = {}
    for record in records:
        by_impl.setdefault(f"{record['side']}:{record['impl']}", []).append(record)
    figures = {name: {"step_ms": 1e3 * statistics.median(r["step_s"] for r in rows),
                      "mfu": statistics.median(r["mfu"] for r in rows),
                      "matmul_peak_gflops": statistics.median(r["matmul_peak_gflops"]
                                                              for r in rows),
                      "num_params": rows[0]["num_params"], "rounds": len(rows)}
               for name, rows in by_impl.items()}
    torch_ms = figures["torch:sdpa"]["step_ms"]
    for name, row in figures.items():
        if name.startswith("jax:"):
            row["ratio_to_torch"] = row["step_ms"] / torch_ms
    return figures


def compare(args: argparse.Namespace) -> dict:
    config = bench.benchmark_config(tiny=args.tiny)
    shape = shape_of(config)
    results: dict = {"command": " ".join(["python -m benchmarks.vs_pytorch", *args.given]),
                     "machine": bench.machine(), "shape": shape, "flop_count": FLOP_COUNT,
                     "architecture": ARCHITECTURE, "rounds": args.rounds, "reps": args.reps,
                     "loadavg_before": bench.loadavg(), "seqs": {}}
    for seq in args.seqs:
        records = measure_seq(seq, args, shape)
        results["seqs"][str(seq)] = {"summary": summarise(records), "records": records}
        results["machine"]["torch"] = next(r["version"] for r in records if r["side"] == "torch")
        results["loadavg_after"] = bench.loadavg()
        if args.out:  # after every sequence: a long run that stops keeps what it measured
            write(results, args.out)
    return results


def write(results: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)


def show(results: dict) -> None:
    print(f"{'seq':>5}  {'side':<14} {'step ms':>9} {'/torch':>7} {'MFU':>6} {'peak GF/s':>9}"
          f" {'N':>9}")
    for seq, entry in results["seqs"].items():
        for name, row in entry["summary"].items():
            ratio = f"{row['ratio_to_torch']:.3f}" if "ratio_to_torch" in row else ""
            print(f"{seq:>5}  {name:<14} {row['step_ms']:>9.1f} {ratio:>7} {row['mfu']:>6.3f}"
                  f" {row['matmul_peak_gflops']:>9.1f} {row['num_params']:>9}")
    print(f"load {results['loadavg_before']} -> {results['loadavg_after']}; "
          f"{results['machine']['cpu']}; jax {results['machine']['jax']}, "
          f"torch {results['machine']['torch']}")


def parse(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m benchmarks.vs_pytorch", description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", default="256,1024", help="comma-separated sequence lengths")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--impls", default="reference,blocked,auto", help=f"JAX: from {IMPLS}")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--tiny", action="store_true", help="benchmark_config(tiny=True): tests")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--side", choices=("jax", "torch"), help="one measurement (internal)")
    p.add_argument("--seq", type=int, default=0, help="with --side")
    p.add_argument("--impl", default="reference", help="with --side=jax")
    p.add_argument("--shape", default=None, help="with --side=torch: shape_of()'s JSON")
    args = p.parse_args(argv)
    args.given = argv
    try:
        args.seqs = [int(s) for s in args.seqs.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seqs wants comma-separated integers, got {args.seqs!r}")
    args.impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    if not args.seqs or min(args.seqs) <= 0:
        p.error(f"--seqs wants positive sequence lengths, got {args.seqs}")
    if bad := [impl for impl in args.impls if impl not in IMPLS]:
        p.error(f"--impls: unknown {bad}; choose from {IMPLS}")
    for name in ("rounds", "reps", "threads"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.side and args.seq <= 0:
        p.error("--side wants --seq=N, N positive")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.side == "jax":
        print(json.dumps(jax_side(args.seq, args.impl, args.reps, args.tiny)), flush=True)
        return 0
    if args.side == "torch":
        shape = json.loads(args.shape) if args.shape else shape_of(
            bench.benchmark_config(tiny=args.tiny))
        print(json.dumps(torch_side(args.seq, args.reps, shape, args.threads)), flush=True)
        return 0
    max_seq = bench.benchmark_config(tiny=args.tiny).model.max_seq_len
    if max(args.seqs) > max_seq:
        print(f"error: --seqs: {max(args.seqs)} exceeds model.max_seq_len {max_seq}",
              file=sys.stderr)
        return 2
    if importlib.util.find_spec("torch") is None:
        print("error: the PyTorch side needs torch: pip install -e '.[reference]'",
              file=sys.stderr)
        return 2
    results = compare(args)
    show(results)
    if args.out:
        print(f"wrote {args.out}")
    return 0 if all(math.isfinite(r["step_s"]) for s in results["seqs"].values()
                    for r in s["records"]) else 1


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main(sys.argv[1:]))
