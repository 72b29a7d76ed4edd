r"""Learning-rate transfer across width under SP and μP, for 1/√d_k, μP's 1/d_k and QK-LayerNorm.

  python -m scale_ablation.sweep --config=experiments/mup_transfer.py:cpu \
      --workdir=runs/mup_transfer_cpu --refine
  python -m scale_ablation.coord_check --config=experiments/mup_transfer.py:cpu \
      --widths=64,128,256,512 --steps=10 --seeds=3 --out=runs/mup_transfer_cpu/coord_check

Width w sets d_model = w with the heads' count fixed (head_dim = w / num_heads, so d_k grows
with the width, the axis the attention scale acts on). μP's base is the smallest width; at it
μP is SP and `mup_inv_dk:<base head dim>` is 1/√d_k. Each (parametrisation, policy, width) runs a
×2 LR grid × seeds; the question (Yang et al. 2022; Lingle 2024, whose table found that 1/√d_k
can break μ-transfer) is whether the located best LR stays within one grid step across widths
(`scale_ablation.analysis.transfer`).

Variants: `cpu` (2 cores: widths 64-256, 4 heads, 2 layers, 300 steps of 16 × 128 bytes, a
16 KiB test split; 7 LRs 2.5e-4..1.6e-2 (5, from 1e-3, at width 256: `LOWEST_LR`) × 2
parametrisations × 3 policies × 2 seeds = 228 runs; measured on the 2-core VM, a group of 28
runs took ~5 min at width 64 and ~19 min at width 128, one of 20 ~28 min at 256: ~2.7 h in all;
`--refine` then added 82 runs in two rounds, ~1 h; published in experiments/results/mup_transfer_cpu).
Seeds 2-4 of the three claimed settings (`MORE_SEEDS`) add 171 runs at the grid's LRs and,
through `--refine`'s fill, 54 at the 18 LRs refining added to those settings: ~2.6 h more. Why this size: a pilot of the earlier design (widths 64-512, 100 steps
of 8 × 64 bytes, 192 of its 288 runs, 2026-12-01) ended every run between 3.65 and 4.8 bits per
byte, above the bigram line (3.59): all `not_learning`, so its optima were those of a model
that had not yet left the bigram plateau. On the base model 16 × 128-byte batches pass the
bigram line near step 200 and reach 3.1-3.2 by 300-400 (experiments/results/stabilisers_cpu).
The pilot's shape, for the record: SP's best LR fell from ~1e-2 (width 64) to 4e-3, 2e-3 and
the grid's lowest, 1e-3, at 512, while μP with mup_inv_dk kept ~8e-3 at 64 and 128; hence a
grid from 2.5e-4. Default (one accelerator: widths 256-2048, 8 heads, 4 layers, 2000 steps)
and `quick` (tests: widths 32 and 64, 2 LRs, 1 seed, a few seconds a run).
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib
from scale_ablation.analysis import transfer

POLICIES = ("inv_sqrt_dk", "mup_inv_dk", "qk_layernorm")  # mup_inv_dk gets the base head dim
SIZES = {  # widths, heads, layers, steps, batch, seq_len, LR grid (×2), seeds
    "quick": ((32, 64), 2, 1, 10, 4, 32, (4e-3, 8e-3), (0,)),
    "cpu": ((64, 128, 256), 4, 2, 300, 16, 128, tuple(2.5e-4 * 2**k for k in range(7)), (0, 1)),
    None: ((256, 512, 1024, 2048), 8, 4, 2000, 64, 256, tuple(2.5e-4 * 2**k for k in range(8)),
           (0, 1, 2)),
}

# The settings the claims judge, and the seeds they get beyond SIZES' (variant -> seeds), at the
# grid's LRs; `sweep --refine` then runs them at every refined LR too (`refine_grid.fill_seeds`).
# Two seeds give a bootstrap over seeds three distinct resamples, and the μP-with-1/√d_k claim
# held at ×1.99 against the ×2 margin on them: five decide it (issue 53 item 6).
CLAIMED = (("mup", "mup_inv_dk"), ("sp", "inv_sqrt_dk"), ("mup", "inv_sqrt_dk"))
MORE_SEEDS = {"cpu": (2, 3, 4)}

# The cpu grid at width 256 starts at 1e-3. At widths 64 and 128 (the first 56 runs, 2026-12-01)
# SP's best LR for 1/√d_k fell from 8e-3 to 4e-3 and no cell's best was below 2e-3, so 2.5e-4
# and 5e-4 would sit ≥ ×4 below any optimum at 256, where a run costs ~3× one at 128; `--refine`
# extends the grid downward if a best lands on 1e-3. (variant, width) -> lowest LR.
LOWEST_LR = {("cpu", 256): 1e-3}


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    widths, heads, layers, steps, batch, seq_len, _, _ = SIZES[arg]
    config = base.get_config({None: "gpu"}.get(arg, "quick" if arg == "quick" else "cpu"))
    config.wandb.tags = ("mup_transfer",)
    m, t = config.model, config.train
    m.d_model, m.num_heads, m.num_layers = widths[0], heads, layers
    m.head_dim = widths[0] // heads
    m.base_d_model, m.base_head_dim = widths[0], widths[0] // heads
    config.data.seq_len, config.data.val_batches = seq_len, 2 if arg else 8
    t.steps, t.batch_size, t.warmup_steps = steps, batch, max(steps // 20, 1)
    t.log_every, t.eval_every, t.diag_every = max(steps // 10, 1), steps, 0
    config.checkpoint.every = steps
    # The LRs are chosen on validation; a small test split keeps its one scoring (69 s at width
    # 512 for the base's 256 KiB) from costing more than the training.
    config.data.test_bytes = 0 if arg == "quick" else 16 * 1024 if arg == "cpu" else 256 * 1024
    return config


def policy_spec(policy: str, arg: str | None) -> str:
    base_head_dim = SIZES[arg][0][0] // SIZES[arg][1]
    return f"mup_inv_dk:{base_head_dim}" if policy == "mup_inv_dk" else policy


def sweep(arg: str | None = None) -> list[dict]:
    widths, heads, _, _, _, _, lrs, seeds = SIZES[arg]
    more = MORE_SEEDS.get(arg, ())

    def seeds_of(parametrization: str, policy: str) -> tuple[int, ...]:
        return seeds + more if (parametrization, policy) in CLAIMED else seeds

    return [
        {"model.parametrization": parametrization, "policy": policy_spec(policy, arg),
         "model.d_model": width, "model.head_dim": width // heads, "train.lr": float(f"{lr:.3g}"),
         "train.seed": seed}
        for parametrization in ("sp", "mup")
        for policy in POLICIES
        for width in widths
        for lr in lrs if lr >= LOWEST_LR.get((arg, width), 0.0)
        for seed in seeds_of(parametrization, policy)
    ]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    """The transfer claims of this study (each judged by `transfer.Transfer.judge`)."""
    (mup_dk, sp_sqrt, mup_sqrt) = ((p, policy_spec(policy, arg)) for p, policy in CLAIMED)
    return [
        claims_lib.Claim("Under μP with 1/d_k the best learning rate is the same at every width",
                         transfer.Transfer((mup_dk,), expect=True), source="Yang et al. 2022"),
        claims_lib.Claim("Under SP with 1/√d_k the best learning rate moves with width",
                         transfer.Transfer((sp_sqrt,), expect=False), source="Yang et al. 2022"),
        claims_lib.Claim("Under μP, 1/√d_k transfers too (the literature disagrees)",
                         transfer.Transfer((mup_sqrt,), expect=True), source="Lingle 2024"),
    ]
