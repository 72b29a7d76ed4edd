r"""The article's §1 list, run as it states it: at d_k 64 (the original Transformer's), scale 1,
1/d_k, 1/ln d_k and a fixed 0.1 "all exploded or oscillated within 500 steps; only 1/√d_k
trained smoothly" (issue 54).

  python -m scale_ablation.sweep --config=experiments/explode_or_oscillate.py:cpu \
      --workdir=runs/explode_or_oscillate_cpu
  python -m scale_ablation.report runs/explode_or_oscillate_cpu

Design. Heads of d_k = d_v = 64 (d_model / heads, as in the original Transformer), 500 steps,
each policy over one LR grid ×2 apart, so that each is judged at its own best LR and at every LR
(`Unstable`: "exploded or oscillated" is the taxonomy's `diverged` or `spiked`, computed from
every step's loss; analysis/failures.py). Both inits: under `fan_in` q and k entries have unit
variance, so at step 0 scale 1's logits have std √64 = 8 and 1/d_k's 1/8: those comparisons are
close to decided at init; under `gpt2` (std 0.02) the logits start ~20× smaller at every scale
and the answer is open. At d_k 64, 1/ln d_k = 0.24 is 1.9× 1/√d_k and 0.1 is 0.8× it: the two
scales the article lists next to 1/√d_k are near it here, and the runs say whether that matters.
The five scalar policies share one compiled program, so one (init, seed) trains as one vmapped
ensemble of every policy and LR.

Claims: per init, each of the four "exploded or oscillated" at every LR (`Unstable` with
kinds diverged and spiked), 1/√d_k did not at some LR, and each of the four ends worse than
1/√d_k at its own best LR (paired by seed, Holm over the family, validation chooses, the test
split reports).

Variants:
- `cpu` (2 cores): d_model 128, 2 layers, 2 heads × 64, batch 16 × 64 bytes, 500 steps (the
  shape of dk_exponent:cpu, whose 400-step runs took ~22 s each summed over its ensembles); 5
  policies × LRs {1.25e-3 … 2e-2} (5, ×2) × 3 seeds × 2 inits = 150 runs, ~70 minutes on 2 idle
  cores (`--plan` prints its estimate).
- default (one accelerator): the original Transformer's base width, d_model 512, 8 heads × 64,
  6 layers, 2000 steps × 64 × 512 bytes, the same policies and inits, LRs ×2 around 1e-3 (5),
  3 seeds.
- `quick` (tests): d_model 32, 1 layer, 2 heads × 16, 20 steps, 2 LRs, 1 seed, fan_in.
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib

REFERENCE = "inv_sqrt_dk"
# The article's list, in its order: no divisor, d_k, log d_k, a fixed 0.1.
LISTED = ("none", "inv_dk", "inv_log_dk", "const:0.1")
POLICIES = (REFERENCE, *LISTED)
INITS = ("fan_in", "gpt2")
EXPLODED_OR_OSCILLATED = ("diverged", "spiked")
# model: (d_model, heads, layers); data: (steps, batch, seq_len); LRs; seeds; inits.
SIZES = {
    "quick": ((32, 2, 1), (20, 4, 32), (4e-3, 8e-3), (0,), ("fan_in",)),
    "cpu": ((128, 2, 2), (500, 16, 64), tuple(1.25e-3 * 2**k for k in range(5)), (0, 1, 2),
            INITS),
    None: ((512, 8, 6), (2000, 64, 512), base.lr_grid_around(1e-3), base.ACCELERATOR_SEEDS,
           INITS),
}


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    (d_model, heads, layers), (steps, batch, seq_len), *_ = SIZES[arg]
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("explode_or_oscillate",)
    m, t = config.model, config.train
    m.d_model, m.num_heads, m.num_layers, m.head_dim = d_model, heads, layers, d_model // heads
    config.data.seq_len, t.steps, t.batch_size = seq_len, steps, batch
    config.data.val_batches = 2 if arg == "quick" else 8
    t.warmup_steps = max(steps // 20, 1)
    t.log_every, t.eval_every, t.diag_every = max(steps // 20, 1), steps // 4, steps // 10
    config.checkpoint.every = steps // 2
    config.data.test_bytes = {"quick": 0, "cpu": 32 * 1024}.get(arg, 256 * 1024)
    return config


def sweep(arg: str | None = None) -> list[dict]:
    _, _, lrs, seeds, inits = SIZES[arg]
    return [{"policy": policy, "model.init": init, "train.lr": float(f"{lr:.3g}"),
             "train.seed": seed}
            for init in inits for policy in POLICIES for lr in lrs for seed in seeds]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    inits = SIZES[arg][-1]
    out = []
    for init in inits:
        def arm(rule, init=init):  # this init's runs alone
            return claims_lib.Within(rule, where=(("model.init", init),))
        out += [claims_lib.Claim(
                    f"{policy} exploded or oscillated within {get_config(arg).train.steps} "
                    f"steps at every LR ({init} init)",
                    arm(claims_lib.Unstable((policy,), kinds=EXPLODED_OR_OSCILLATED)),
                    source="article §1")
                for policy in LISTED]
        out.append(claims_lib.Claim(
            f"1/√d_k neither exploded nor oscillated at some LR ({init} init)",
            arm(claims_lib.Unstable((REFERENCE,), expect_unstable=False,
                                    kinds=EXPLODED_OR_OSCILLATED)),
            source="article §1"))
        out.append(claims_lib.Claim(
            f"Each of the article's other scales ends worse than 1/√d_k at its own best LR "
            f"({init} init)",
            arm(claims_lib.Compare("worse", policies=LISTED, at="best_lr")),
            source="article §1"))
    return out
