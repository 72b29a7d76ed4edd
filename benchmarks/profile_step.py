r"""Where a train step spends its time: `python -m benchmarks.profile_step [SHAPE]`.

SHAPE is `benchmark` (the default: `benchmarks.run`'s model) or one of the studies' shapes of
`benchmarks.arrangements.SHAPES` (dk_exponent, mup_transfer, headline), whose config is the
study's own at the settings named there.

Each part of the step is jitted alone on the step's own shapes and timed forward and backward
(the optimiser: one update), then multiplied by how often the step runs it:
  attention  q/k/v/out projections and the policy attention of one layer, x num_layers
  mlp        the GELU MLP of one layer, x num_layers
  norms      one LayerNorm, x (2·num_layers + 1)
  embed_loss the embedding, position embedding, tied output matmul and cross-entropy
  optimizer  AdamW with clipping and the schedule over every parameter, applied
The parts' sum against the whole step says what fusion across parts saves or costs; each part's
MFU uses its own FLOPs (2 per multiply-add, forward + 2x backward) over the measured matmul peak.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from benchmarks import run as bench
from scale_ablation.training import optim, run_config, run_setup, steps


def _fwd_bwd(module: nnx.Module, call, *inputs):
    """A jitted forward + backward of `call(module, *inputs)` (summed), over the module's
    parameters and its float inputs."""
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)

    def loss(params, *inputs):
        return call(nnx.merge(graphdef, params, rest), *inputs).astype(jnp.float32).sum()

    argnums = tuple(range(1 + sum(jnp.issubdtype(x.dtype, jnp.floating) for x in inputs)))
    grad = jax.jit(jax.grad(loss, argnums=argnums))
    return lambda: grad(params, *inputs)


def parts(config) -> dict[str, tuple]:
    """{part: (timed function, times per step, FLOPs per call)}."""
    m, batch, seq = config.model, config.train.batch_size, config.data.seq_len
    graphdef, state = run_setup.init_state(config)
    model = nnx.merge(graphdef, state["params"], state["rest"])
    block = model.blocks[0]
    x = jax.random.normal(jax.random.key(0), (batch, seq, m.d_model), jnp.float32)
    tokens = jnp.zeros((batch, seq), jnp.int32)
    inner, hidden, tokens_n = m.num_heads * m.head_dim, 4 * m.d_model, batch * seq
    attention_flops = 3 * (2 * tokens_n * 4 * m.d_model * inner
                           + 2 * 2 * batch * m.num_heads * seq * seq * m.head_dim)
    mlp_flops = 3 * 2 * tokens_n * 2 * m.d_model * hidden
    logits_flops = 3 * 2 * tokens_n * m.d_model * run_config.model_config(config).vocab_size

    def embed_loss(model, _):
        h = model.embed(tokens)
        if model.position_embed is not None:
            h = h + model.position_embed(jnp.arange(seq))[None]
        logits = model.embed.attend(h).astype(jnp.float32)
        return steps.cross_entropy(logits, tokens, jnp.ones_like(logits[..., 0]), 0.0)[0]

    tx = optim.make_optimizer(config)
    params, opt_state = state["params"], tx.init(state["params"])
    grads = jax.tree.map(jnp.ones_like, params)
    update = jax.jit(lambda g, s, p: optax.apply_updates(p, tx.update(g, s, p)[0]))
    return {
        "attention": (_fwd_bwd(block.attention, lambda a, h: a(h)[0], x), m.num_layers,
                      attention_flops),
        "mlp": (_fwd_bwd(block, lambda b, h: b.mlp(h), x), m.num_layers, mlp_flops),
        "norms": (_fwd_bwd(block.attention_norm, lambda n, h: n(h), x), 2 * m.num_layers + 1, 0),
        "embed_loss": (_fwd_bwd(model, embed_loss, x), 1, logits_flops),
        "optimizer": (lambda: update(grads, opt_state, params), 1, 0),
    }


def breakdown(config, reps: int = 5) -> dict:
    """Seconds per step of each part, its share of the whole step and its MFU."""
    timed = parts(config)
    peak = bench.matmul_peak_gflops(reps) * 1e9
    step, _ = bench.step_seconds(config, reps)
    out = {"step_seconds": step, "matmul_peak_gflops": peak / 1e9, "parts": {}}
    for name, (fn, times, flops) in timed.items():
        seconds = bench.median_seconds(fn, reps=reps)
        out["parts"][name] = {"seconds_per_step": seconds * times,
                              "share_of_step": seconds * times / step,
                              "mfu": flops / seconds / peak if flops else None}
    out["parts_sum_over_step"] = sum(p["seconds_per_step"] for p in out["parts"].values()) / step
    return out


def config_of(shape: str):
    """The config of SHAPE, None if there is no such shape."""
    from benchmarks import arrangements

    if shape == "benchmark":
        return bench.benchmark_config()
    return arrangements.shape_config(shape) if shape in arrangements.SHAPES else None


def main(argv: list[str]) -> int:
    from benchmarks import arrangements

    shape = argv[1] if len(argv) > 1 else "benchmark"
    config = config_of(shape) if len(argv) <= 2 else None
    if config is None:
        print(f"profile_step: takes one shape, from {['benchmark', *arrangements.SHAPES]}; "
              f"got {' '.join(argv[1:])!r}", file=sys.stderr)
        return 2
    result = breakdown(config)
    print(f"shape {shape}: batch {config.train.batch_size} × seq {config.data.seq_len}, "
          f"d_model {config.model.d_model}, {config.model.num_layers} layers")
    print(f"step {result['step_seconds'] * 1e3:.1f} ms, matmul peak "
          f"{result['matmul_peak_gflops']:.1f} GFLOP/s")
    for name, part in result["parts"].items():
        mfu = f"{part['mfu']:.2f}" if part["mfu"] is not None else "-"
        print(f"  {name:<11} {part['seconds_per_step'] * 1e3:8.1f} ms  "
              f"{part['share_of_step']:6.1%} of the step  MFU {mfu}")
    print(f"  parts sum / step {result['parts_sum_over_step']:.2f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
