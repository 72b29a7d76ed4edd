r"""Learning-rate transfer along the head dim (μP's width grown through d_k at fixed heads and
d_model) under SP with 1/√d_k, μP with 1/d_k and μP with 1/√d_k: the article's question asked
the way μP asks it (issue 55 item 1).

  python -m scale_ablation.sweep --config=experiments/mup_head_dim.py:cpu \
      --workdir=runs/mup_head_dim_cpu --refine
  python -m scale_ablation.coord_check --config=experiments/mup_head_dim.py:cpu --axis=head_dim \
      --widths=16,32,64,128,256 --steps=10 --seeds=3 \
      --parametrizations=sp:inv_sqrt_dk,mup,mup:inv_sqrt_dk --out=runs/mup_head_dim_cpu/coord

Two arms (README, "μP"): `cpu` grows q, k and v per head together (`model.head_dim`), where
head-dim μP rescales the attention's output projection (init × (B/d)^½, Adam's step × B/d,
model/parametrization.py) and its attention scale is `mup_inv_dk:B`; `cpu_qk` grows q/k alone
(`model.qk_dim`, the value width B), where μP changes no init or LR, so its two settings are the
scale alone (`mup_inv_dk:B` against 1/√d_k). B = 16, the smallest head dim, at which every
setting is SP with 1/√d_k. Each (parametrisation, policy, d_k) runs a ×2 LR grid × 3 seeds:
located.py's measured coverage of a best LR's interval is 97.2% at 3 seeds (analysis/located.py's
table); `--refine` then adds LRs until each best is interior and bracketed at ×√2.

Variants: `cpu` (2 cores: d_model 64, 4 heads, 2 layers, 300 steps of 16 × 128 bytes as
mup_transfer's cpu, where these runs leave the bigram line; head dims 16-128; 7 LRs
5e-4..3.2e-2; 3 settings × 4 head dims × 7 LRs × 3 seeds = 252 runs), `cpu_qk` (the q/k arm on
the same model: 2 settings × 4 q/k dims × 7 LRs × 3 seeds = 168 runs), default (one
accelerator: d_model 512, 8 heads, 4 layers, 2000 steps of 64 × 256, head dims 32-256, base 32,
8 LRs from 2.5e-4) and `quick` (tests: d_model 32, head dims 16 and 32, 2 LRs, 1 seed).

Claims: per setting, whether its best LR transfers along the arm's axis (`transfer.Transfer`
with `axis`: the head dim or the q/k width; the rule's margin is one grid step, ×2, intervals
included): μP with 1/d_k should (Yang et al. 2022), SP with 1/√d_k should not, and μP with
1/√d_k is the article's choice asked μP's way.

Published: `cpu` in experiments/results/mup_head_dim_cpu (324 runs with one `--refine` round): μP
with 1/d_k transfers (×1.24), 1/√d_k's best LR falls with the head dim under μP (×1.55) and SP
(×1.44), both undecided against ×2. `cpu_qk` has not been run.
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib
from scale_ablation.analysis import transfer

# (parametrisation, policy) per arm; mup_inv_dk gets the base head dim (`policy_spec`).
SETTINGS = {"head_dim": (("sp", "inv_sqrt_dk"), ("mup", "mup_inv_dk"), ("mup", "inv_sqrt_dk")),
            "qk_dim": (("mup", "mup_inv_dk"), ("mup", "inv_sqrt_dk"))}
SIZES = {  # d_model, heads, layers, steps, batch, seq_len, head dims (base first), LRs, seeds
    "quick": (32, 2, 1, 10, 4, 32, (16, 32), (4e-3, 8e-3), (0,)),
    "cpu": (64, 4, 2, 300, 16, 128, (16, 32, 64, 128), tuple(5e-4 * 2**k for k in range(7)),
            (0, 1, 2)),
    None: (512, 8, 4, 2000, 64, 256, (32, 64, 128, 256), tuple(2.5e-4 * 2**k for k in range(8)),
           base.ACCELERATOR_SEEDS),
}
VARIANTS = {"quick": "quick", "cpu": "cpu", "cpu_qk": "cpu", None: None}  # variant -> its sizes


def arm_of(arg: str | None) -> str:
    return "qk_dim" if arg == "cpu_qk" else "head_dim"


def policy_spec(policy: str, arg: str | None) -> str:
    base_dim = SIZES[VARIANTS[arg]][6][0]
    return f"mup_inv_dk:{base_dim}" if policy == "mup_inv_dk" else policy


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu", "cpu_qk"))
    d_model, heads, layers, steps, batch, seq_len, dims, _, _ = SIZES[VARIANTS[arg]]
    config = base.get_config({None: "gpu"}.get(arg, "quick" if arg == "quick" else "cpu"))
    config.wandb.tags = ("mup_head_dim",)
    m, t = config.model, config.train
    m.d_model, m.num_heads, m.num_layers, m.head_dim = d_model, heads, layers, dims[0]
    # Head-dim μP: the base is this d_model at the smallest head dim (parametrization.py).
    m.base_d_model, m.base_head_dim = d_model, dims[0]
    config.data.seq_len, config.data.val_batches = seq_len, 2 if arg else 8
    t.steps, t.batch_size, t.warmup_steps = steps, batch, max(steps // 20, 1)
    t.log_every, t.eval_every, t.diag_every = max(steps // 10, 1), steps, 0
    config.checkpoint.every = steps
    # The LRs are chosen on validation; a small test split keeps its one scoring cheap.
    config.data.test_bytes = 0 if arg == "quick" else 16 * 1024 if arg else 256 * 1024
    return config


def sweep(arg: str | None = None) -> list[dict]:
    *_, dims, lrs, seeds = SIZES[VARIANTS[arg]]
    axis = arm_of(arg)
    return [
        {"model.parametrization": parametrization, "policy": policy_spec(policy, arg),
         f"model.{axis}": dim, "train.lr": float(f"{lr:.3g}"), "train.seed": seed}
        for parametrization, policy in SETTINGS[axis]
        for dim in dims
        for lr in lrs
        for seed in seeds
    ]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    """The transfer claims along the arm's axis (each judged by `transfer.Transfer.judge`)."""
    axis = arm_of(arg)
    column, along = f"override:model.{axis}", transfer.AXES[f"override:model.{axis}"]
    mup_1_over_dk = ("mup", policy_spec("mup_inv_dk", arg))
    out = [claims_lib.Claim(f"Under μP with 1/d_k the best learning rate is the same at every "
                            f"{along}", transfer.Transfer((mup_1_over_dk,), axis=column),
                            source="Yang et al. 2022"),
           claims_lib.Claim(f"Under μP, 1/√d_k transfers along the {along} too",
                            transfer.Transfer((("mup", "inv_sqrt_dk"),), axis=column),
                            source="article §2.3")]
    if axis == "head_dim":  # the q/k arm has no SP setting: μP changes only its scale there
        out.insert(1, claims_lib.Claim(
            f"Under SP with 1/√d_k the best learning rate moves with the {along}",
            transfer.Transfer((("sp", "inv_sqrt_dk"),), expect=False, axis=column),
            source="Yang et al. 2022"))
    return out
