r"""The CPU ensemble program two ways, side by side (issue 56 item 3):

    taskset -c 0 python -m benchmarks.members_loop [--shape=dk_exponent] [--members=16]
        [--rounds=6] [--steps=5]

`lax.map` over the stacked members (the sweep's program until 2026-12-07) against the in-place
loop `steps.over_members` now builds: member i sliced out of the stacked state, stepped, and
written back with a dynamic update. Both compile with the runs' compiler options and donate the
state; each round times `--steps` calls of each, in alternating order; rates are run-steps per
second (members × calls / seconds). It prints the copies XLA put at each program's entry and
whether both left every member's parameters the same to the bit. Run one copy per core
(`taskset -c 0 ... & taskset -c 1 ...`) to measure the workers' arrangement.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import arrangements
from scale_ablation.training import steps
from scale_ablation.training.optim import OptimizerSettings, make_optimizer


def lax_map_members(step):
    """The earlier CPU ensemble: `lax.map` builds each output as a new stack."""
    def train_step_members(states, batches, keys):
        return jax.lax.map(lambda a: step(*a), (states, batches, keys))

    return train_step_members


def setup(shape: str, members: int):
    """(seeded step, stacked initial states of seeds 0..K-1, batches (K, B, T), seeds)."""
    config = arrangements.shape_config(shape)
    graphdef, states, rows = arrangements.member_inputs(config, members)
    settings = OptimizerSettings.of(config)
    step = steps.seeded(steps.make_train_step(graphdef, make_optimizer(settings), 0.0,
                                              settings.loss_scaling))
    stack = lambda trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees)  # noqa: E731  (K, ...)
    return step, stack(states), stack(rows), jnp.arange(members, dtype=jnp.int32)


def compare(args) -> dict:
    step, stack, batch, seeds = setup(args.shape, args.members)
    builders = {"lax_map": lax_map_members(step), "in_place": steps.over_members(step, "cpu")}
    compiled, states, out = {}, {}, {"copies_at_entry": {}, "run_steps_per_s": {}}
    for name, fn in builders.items():
        states[name] = jax.tree.map(jnp.copy, stack)
        compiled[name] = jax.jit(fn, donate_argnums=0, compiler_options=steps.compiler_options()
                                 ).lower(states[name], batch, seeds).compile()
        out["copies_at_entry"][name] = compiled[name].as_text().split("ENTRY")[1].count(" copy(")
        states[name], metrics = compiled[name](states[name], batch, seeds)  # warm-up
        jax.block_until_ready(metrics)
        out["run_steps_per_s"][name] = []
    for index in range(args.rounds):
        for name in builders if index % 2 == 0 else list(builders)[::-1]:
            start = time.perf_counter()
            for _ in range(args.steps):
                states[name], metrics = compiled[name](states[name], batch, seeds)
            jax.block_until_ready(metrics)
            rate = args.members * args.steps / (time.perf_counter() - start)
            out["run_steps_per_s"][name].append(round(rate, 2))
    old, new = (jax.tree.leaves(states[name]["params"]) for name in builders)
    out["same_bits"] = all(np.array_equal(a, b) for a, b in zip(old, new, strict=True))
    return out


def main(argv: list[str]) -> int:
    p = arrangements._Parser(prog="python -m benchmarks.members_loop",
                             description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="dk_exponent", choices=list(arrangements.SHAPES))
    p.add_argument("--members", type=int, default=16)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    if args.members < 2 or args.rounds < 1 or args.steps < 1:
        p.error("--members must be >= 2, --rounds and --steps >= 1")
    out = compare(args)
    for name, rates in out["run_steps_per_s"].items():
        print(f"{name:>8}: {np.median(rates):6.2f} run-steps/s (median of {rates}), "
              f"{out['copies_at_entry'][name]} copies at entry")
    ratio = (np.median(out["run_steps_per_s"]["in_place"])
             / np.median(out["run_steps_per_s"]["lax_map"]))
    print(f"in place / lax.map: ×{ratio:.3f}; same bits: {out['same_bits']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
