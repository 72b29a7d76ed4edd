r"""Causal attention forward + backward, dense against blocked, by sequence length:
`python -m benchmarks.attention_blocks [--seqs=128,256,512,1024] [--blocks=64,128] [--groups=1,4]
[--out F.json]`.

Times the attention core alone (q, k, v already projected; the inv_sqrt_dk scale), jitted, as
`jax.grad` of a sum over q, k and v, on float32 [batch 16, seq, 4 heads, head_dim 64]:
  dense      one masked [T, T] softmax (`attend(..., return_internals=True)`'s computation)
  reference  `attend(implementation="reference")` as it is (query blocks of
             attention.CAUSAL_BLOCK when the length allows, else dense)
  blocked    `blocked_attention` as "blocked" and "auto" run it (online softmax, custom VJP;
             blocks of `default_block_size(T)`, groups of GROUP_SIZE (batch, head) pairs)
  blocked:N/G the same with blocks of N and groups of G
Within one length the implementations are timed alternately, one call each per round, and each
reports the median over the rounds, so that load from other processes falls on all of them alike;
/proc/loadavg before and after is recorded, because the cores here are shared and a loaded
machine moves every number. `crossover_seq[versus]` is the first length from which the default
blocked path ("blocked") beats `versus` (dense, reference) at it and at every longer length.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from scale_ablation.model import attention, blocked_attention, policies

_SEQS = flags.DEFINE_list("seqs", ["128", "256", "512", "1024"], "Sequence lengths.")
_BLOCKS = flags.DEFINE_list("blocks", [], "Other block sizes of the blocked path to time.")
_GROUPS = flags.DEFINE_list("groups", ["4"], "(batch, head) pairs per group, with --blocks.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed calls per implementation and length.")
_BATCH = flags.DEFINE_integer("batch", 16, "Batch size.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
HEADS, HEAD_DIM = 4, 64


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def implementations(blocks: list[int], groups: list[int]) -> dict:
    """{name: attention(q, k, v) -> out} for the inv_sqrt_dk policy."""
    policy = policies.get("inv_sqrt_dk")

    def dense(q, k, v):
        out, _ = attention.attend(q, k, v, policy=policy, return_internals=True)
        return out

    def reference(q, k, v):
        return attention.attend(q, k, v, policy=policy, implementation="reference")

    def blocked(block, group):
        def run(q, k, v):
            scale = jnp.full((q.shape[1], HEADS), 1 / HEAD_DIM**0.5, jnp.float32)
            return blocked_attention.blocked_attention(q, k, v, scale, block_size=block,
                                                       group_size=group)
        return run

    impls = {"dense": dense, "reference": reference,
             "blocked": blocked(None, blocked_attention.GROUP_SIZE)}  # what "auto" runs
    impls.update({f"blocked:{block}/{group}": blocked(block, group)
                  for block in blocks for group in groups})
    return impls


def _timed_grad(fn, q, k, v):
    grad = jax.jit(jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2)))
    start = time.perf_counter()
    jax.block_until_ready(grad(q, k, v))  # compile and first run
    compile_s = time.perf_counter() - start
    jax.block_until_ready(grad(q, k, v))  # warm-up
    return grad, compile_s


def measure(seq: int, impls: dict, rounds: int, batch: int) -> dict:
    rng = np.random.default_rng(seq)
    q, k, v = (jnp.asarray(rng.standard_normal((batch, seq, HEADS, HEAD_DIM)), jnp.float32)
               for _ in range(3))
    grads, compile_s = {}, {}
    for name, fn in impls.items():
        grads[name], compile_s[name] = _timed_grad(fn, q, k, v)
    times = {name: [] for name in impls}
    for _ in range(rounds):  # alternate: one call of each per round
        for name, grad in grads.items():
            start = time.perf_counter()
            jax.block_until_ready(grad(q, k, v))
            times[name].append(time.perf_counter() - start)
    return {name: {"median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t),
                   "first_call_s": compile_s[name]} for name, t in times.items()}


def crossover(results: dict[int, dict], versus: str) -> int | None:
    """The first length from which on the default blocked path beats `versus` (median times)."""
    answer = None
    for seq in sorted(results, reverse=True):
        row = results[seq]
        if row["blocked"]["median_ms"] >= row[versus]["median_ms"]:
            break
        answer = seq
    return answer


def main(argv) -> int:
    del argv
    impls = implementations([int(b) for b in _BLOCKS.value], [int(g) for g in _GROUPS.value])
    load_before, start = _loadavg(), time.perf_counter()
    results = {}
    for seq in (int(s) for s in _SEQS.value):
        results[seq] = measure(seq, impls, _ROUNDS.value, _BATCH.value)
        cells = "  ".join(f"{name} {t['median_ms']:7.1f}" for name, t in results[seq].items())
        print(f"seq {seq:5d}  {cells}  (ms, median of {_ROUNDS.value})", flush=True)
    summary = {
        "command": "python -m benchmarks.attention_blocks " + " ".join(sys.argv[1:]),
        "shape": {"batch": _BATCH.value, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "float32"},
        "what": "jit(grad(sum(attention(q, k, v)))) over q, k, v: forward + backward",
        "machine": f"{platform.processor() or platform.machine()}, {jax.device_count()} "
                   f"{jax.devices()[0].platform} device(s), jax {jax.__version__}",
        "loadavg_before": load_before, "loadavg_after": _loadavg(),
        "wall_s": time.perf_counter() - start,
        "results_ms": results,
        "crossover_seq": {versus: crossover(results, versus) for versus in ("dense", "reference")},
    }
    print(f"blocked faster from seq (None: at no length) {summary['crossover_seq']} on; "
          f"load {load_before} -> {summary['loadavg_after']}")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    app.run(main)
