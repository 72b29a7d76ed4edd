r"""Learning-rate transfer along depth: SP against CompleteP at α = 1/2 and α = 1 (Dey et al. 2025,
"Don't be lazy: CompleteP enables compute-efficient deep transformers"), with the attention
scale as a second factor, 1/√d_k against 1/d_k (issue 55 item 2).

  python -m scale_ablation.sweep --config=experiments/completep_transfer.py:cpu \
      --workdir=runs/completep_transfer_cpu --refine
  python -m scale_ablation.coord_check --config=experiments/completep_transfer.py:cpu \
      --config.train.batch_size=8 --config.data.seq_len=64 --config.train.lr=0.01 \
      --axis=num_layers --widths=2,4,8,16 --steps=10 --seeds=3 \
      --parametrizations=sp,mup@0.5,mup@1 --keep_policy --out=runs/completep_transfer_cpu/coord

(both are published: experiments/results/completep_transfer_cpu, 333 runs after two --refine
rounds, 1 h 44 min on the idle 2-core VM; experiments/results/completep_coord_check_cpu.)

The depth L grows at a fixed width; CompleteP's base depth L_base is the smallest
(`model.base_num_layers`). The arms: SP (`model.depth_alpha` 0), and CompleteP with α = 1/2 and
α = 1 (model/depth.py: residual branches × (L/L_base)^-α, the blocks' AdamW update ×
(L/L_base)^(α-1), their Adam ε × (L/L_base)^-α), run as `model.parametrization=mup` at its base
width (CompleteP is μP plus depth; at one width μP's multipliers are all 1, so this μP is SP).
The scales: `inv_sqrt_dk` and `inv_dk` (1/d_k itself: at a fixed head dim μP's
`mup_inv_dk:B` with B = d_k would be 1/√d_k again). Each (arm, scale, depth) runs a ×2 LR grid ×
3 seeds: located.py's measured coverage of a best LR's interval is 97.2% at 3 seeds; `--refine`
then adds LRs until each best is interior and bracketed at ×√2.

Variants: `cpu` (2 cores: d_model 64, 4 heads of 16, depths 2, 4 and 8 from base 2, 300 steps
of 16 × 128 bytes as mup_head_dim's cpu; 4 LRs 2e-3..1.6e-2 around the 8.4e-3 mup_transfer_cpu
located for this shape at depth 2 (SP, 1/√d_k); 3 arms × 2 scales × 3 depths × 4 LRs × 3 seeds
= 216 runs in 9 programs; `--plan` on the shared 2-core VM, 2026-12-05: 2.28e14 train FLOPs
(depths 2, 4, 8: 3.5e13, 6.6e13, 1.27e14; +1.0e12 evaluation), 2.8 hours at the planner's 40% of
the 57-58 GFLOP/s matmul it measured under the usual load (1.8 h at 89 GFLOP/s when lighter, 4.3
h at 38 in a load spike); 5 LRs to 3.2e-2 planned 270 runs, 3.5 h at 57 GFLOP/s), default
(one accelerator: d_model 512, 8 heads of 64, depths 4-32 from base 4, 2000 steps of 64 × 256,
8 LRs from 2.5e-4) and `quick` (tests: d_model 32, depths 1 and 2 from base 1, 2 LRs, 1 seed:
24 runs of 6 steps).

Claims: per scale, SP's best LR moves with depth, and CompleteP's stays at α = 1/2 and at α = 1
(`transfer.Transfer` along `override:model.num_layers`, the margin one grid step, ×2, intervals
included), each over the runs of its α alone (`AtAlpha`). The report's best_lr_vs_num_layers.png
gives each α a panel of its own (`transfer_plots` names the arm "mup α=0.5").
"""

import dataclasses

from experiments import base
from scale_ablation.analysis import claims as claims_lib
from scale_ablation.analysis import transfer

AXIS = "override:model.num_layers"
SCALES = ("inv_sqrt_dk", "inv_dk")
ARMS = (("sp", 0.0), ("mup", 0.5), ("mup", 1.0))  # (parametrisation, model.depth_alpha)
SIZES = {  # d_model, heads, head dim, depths (base first), steps, batch, seq_len, LRs, seeds
    "quick": (32, 2, 16, (1, 2), 6, 4, 32, (4e-3, 8e-3), (0,)),
    "cpu": (64, 4, 16, (2, 4, 8), 300, 16, 128, tuple(2e-3 * 2**k for k in range(4)), (0, 1, 2)),
    None: (512, 8, 64, (4, 8, 16, 32), 2000, 64, 256, tuple(2.5e-4 * 2**k for k in range(8)),
           base.ACCELERATOR_SEEDS),
}


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    d_model, heads, head_dim, depths, steps, batch, seq_len, _, _ = SIZES[arg]
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("completep_transfer",)
    m, t = config.model, config.train
    m.d_model, m.num_heads, m.head_dim, m.num_layers = d_model, heads, head_dim, depths[0]
    # CompleteP's base depth; μP's base width is the model's own (its multipliers all 1).
    m.base_num_layers, m.base_d_model, m.base_head_dim = depths[0], d_model, head_dim
    config.data.seq_len, config.data.val_batches = seq_len, 2 if arg else 8
    t.steps, t.batch_size, t.warmup_steps = steps, batch, max(steps // 20, 1)
    t.log_every, t.eval_every, t.diag_every = max(steps // 10, 1), steps, 0
    config.checkpoint.every = steps
    # The LRs are chosen on validation; a small test split keeps its one scoring cheap.
    config.data.test_bytes = 0 if arg == "quick" else 16 * 1024 if arg else 256 * 1024
    return config


def sweep(arg: str | None = None) -> list[dict]:
    *_, depths, _, _, _, lrs, seeds = SIZES[arg]
    return [
        {"model.parametrization": parametrization, "model.depth_alpha": alpha, "policy": scale,
         "model.num_layers": depth, "train.lr": float(f"{lr:.3g}"), "train.seed": seed}
        for parametrization, alpha in ARMS
        for scale in SCALES
        for depth in depths
        for lr in lrs
        for seed in seeds
    ]


@dataclasses.dataclass(frozen=True)
class AtAlpha(claims_lib.Within):
    """A `transfer.Transfer` over the runs of one `model.depth_alpha` alone: the arms share
    their (parametrisation, policy) keys, which is all `transfer.optima` groups by."""

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(policy for _, policy in self.rule.settings)

    @property
    def reference(self) -> None:
        return None


def at_alpha(parametrization: str, alpha: float, scale: str, expect: bool) -> AtAlpha:
    rule = transfer.Transfer(((parametrization, scale),), expect=expect, axis=AXIS)
    return AtAlpha(rule, (("model.depth_alpha", alpha),))


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    """Per attention scale: SP's best LR moves with depth; CompleteP's stays at α = 1/2 and 1."""
    out = []
    for scale in SCALES:
        name = {"inv_sqrt_dk": "1/√d_k", "inv_dk": "1/d_k"}[scale]
        out += [
            claims_lib.Claim(f"Under SP with {name} the best learning rate moves with depth",
                             at_alpha("sp", 0.0, scale, False), source="Dey et al. 2025"),
            claims_lib.Claim(f"Under CompleteP's α = 1/2 with {name} the best learning rate is "
                             "the same at every depth", at_alpha("mup", 0.5, scale, True),
                             source="Dey et al. 2025"),
            claims_lib.Claim(f"Under CompleteP (α = 1) with {name} the best learning rate is "
                             "the same at every depth", at_alpha("mup", 1.0, scale, True),
                             source="Dey et al. 2025"),
        ]
    return out
