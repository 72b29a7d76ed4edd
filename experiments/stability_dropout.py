r"""The "stability triangle"'s third side: attention dropout, with 1/√d_k and with scale 1
(article §6.5; issue 54). The stability study ran clipping and warmup only.

  python -m scale_ablation.sweep --config=experiments/stability_dropout.py:cpu \
      --workdir=runs/stability_dropout_cpu --refine --refine_rounds=1
  python -m scale_ablation.report runs/stability_dropout_cpu

The article (§6.5): dropout after the softmax "prevents overfitting and indirectly smooths the
weight distribution", and with clipping and warmup forms a "stability triangle" with the scale.
`model.attention_dropout` drops attention weights after the softmax in training only (inverted
dropout, a key per step and layer; evaluation and the diagnostics run without it:
`model/attention.py`, tests/test_attention.py).

Design. The stability study's cpu model and its both-on setting (clip 1, 50 warmup steps), with
and without attention dropout 0.1, 1/√d_k and scale 1, 3 seeds, over the stability study's LR
grid (1e-3, 3e-3, 1e-2) carried to its large end, 1.73e-2 and 3e-2: stability_cpu's
instabilities live there (at 1e-2 1/√d_k's attention entropy collapsed in one seed of five with
both stabilisers on, in four of five without warmup; scale 1 collapsed at every LR from 5.5e-3),
and nothing it ran diverged. The dropout rate is a static field of the model, so the two arms
compile apart: 2 ensembles of 2 policies × 5 LRs × 3 seeds, and each refined LR its own.

Claims (dropout's arms `0.0` and `0.1` as values of `model.attention_dropout`, paired by scale
policy, LR and seed; Holm over the study's tests):
- without dropout training ends worse, each policy at its own best LR (the triangle's claim in
  the stability study's form);
- with dropout the attention weights end smoother, each policy at its own best LR: the final
  largest attention weight (the article's max-weight ratio, layer mean, measured without
  dropout) is lower;
- at the large-LR end (LR >= 1e-2): without dropout the policy trains smoothly at no LR, and
  with dropout at some LR (the taxonomy's every failure kind: diverged, spiked, entropy
  collapse, not learning, collapsed). Both supported: dropout moves where training is smooth;
- more runs diverge without dropout than with it at LR >= 1e-2 (both policies counted
  together; contradicted if none diverges: nothing for dropout to prevent). Expected so: no
  float32 run of this model has diverged up to 6.81e-2 (stability_cpu, precision_cpu); the
  claim says so with its counts rather than leaving the article's divergence reading untested.

Variants:
- `cpu` (2 cores): the base CPU model (d_model 128, 2 layers, 4 heads × d_k 32, 600 steps ×
  16 × 128 bytes); 2 dropout rates × 2 policies × 5 LRs × 3 seeds = 60 runs, 2.04e14 train
  FLOPs (`--plan`), and one refine round (`--refine --refine_rounds=1`) adds about 24 (two LRs
  beside each of the 4 settings' best, 3 seeds), ~2.9e14 in all. At stability_cpu's own rate
  (4.05e14 FLOPs in 1.33 h on 2 idle cores, 85 GFLOP/s) that is ~40 minutes, ~1 h with the
  refine round; `--plan`, at 40% of the matmul peak it measured on the loaded machine (90
  GFLOP/s), says 1.62 h for the 60.
- default (one accelerator): the stability study's accelerator model (d_k 256 as the q/k width
  of 8 heads at d_model 512), both stabilisers on, the two dropout rates, both policies over 7
  LRs ×2 apart around 1/√d_k's cpu best (3e-3; scale 1's, 1e-3, inside), 3 seeds: 84 runs; the
  large end from 1.2e-2. 3.3e18 train FLOPs, 2.34 device-hours on one H200 (`--plan
  --device=H200`, 40% MFU assumed).
- `quick` (tests): the quick model, LRs 3e-3 and 1e-2, one seed.
"""

from experiments import base, stability
from scale_ablation.analysis import claims as claims_lib

POLICIES = stability.POLICIES
NAMES = {"inv_sqrt_dk": "1/√d_k", "none": "scale 1"}  # in the claims' words (`none` is a policy)
DROPOUT = 0.1  # the original Transformer's rate (Vaswani et al. 2017), on the weights
RATES = (0.0, DROPOUT)
CPU_LRS = (*stability.CPU_LRS, 1.73e-2, 3e-2)  # the stability grid and its large end
# The default: both policies over 7 LRs ×2 apart around 1/√d_k's cpu best (3e-3), so that scale
# 1's (1e-3) is inside too and both reach the large end.
LRS = {"quick": (3e-3, 1e-2), "cpu": CPU_LRS, None: base.lr_grid_around(3e-3, points=7)}
LARGE_LR = {"quick": 1e-2, "cpu": 1e-2, None: LRS[None][-2]}  # where the smoothness claims look


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    config = stability.get_config(arg)
    config.wandb.tags = ("stability_dropout",)
    config.train.grad_clip = 1.0  # both stabilisers on (the stability study's first setting)
    # The fused kernel has no dropout (`attention.fused_unsupported_reason`): both arms on the
    # reference path, so that they differ in the dropout alone.
    config.model.attention_impl = "reference"
    if arg is not None:
        config.train.warmup_steps = stability.CPU_WARMUP if arg == "cpu" else 10
    else:
        config.train.warmup_steps = max(1, config.train.steps // 10)
    return config


def sweep(arg: str | None = None) -> list[dict]:
    shape = ({"model.qk_dim": stability.ACCELERATOR_QK_DIM} if arg is None else
             {"model.head_dim": 32})
    seeds = {"quick": (0,), "cpu": (0, 1, 2)}.get(arg, base.ACCELERATOR_SEEDS)
    return [{"policy": policy, "model.attention_dropout": rate, **shape, "train.lr": lr,
             "train.seed": seed}
            for rate in RATES for policy in POLICIES for lr in LRS[arg]
            for seed in seeds]


def _arms(rule, policies: tuple[str, ...] = POLICIES, min_lr: float = 0.0) -> claims_lib.Arms:
    return claims_lib.Arms(rule, field="model.attention_dropout", policies=policies,
                           min_lr=min_lr)


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    off, on = str(RATES[0]), str(DROPOUT)
    large = LARGE_LR[arg]
    out = []
    for policy in POLICIES:
        name = NAMES[policy]
        out += [
            claims_lib.Claim(
                f"Without attention dropout training ends worse ({name})",
                _arms(claims_lib.Compare("worse", policies=(off,), reference=on), (policy,)),
                source="article §6.5"),
            claims_lib.Claim(
                f"Attention dropout smooths the attention weights: with it the final largest "
                f"attention weight is lower ({name}, each arm at its own best LR)",
                _arms(claims_lib.Compare("better", policies=(on,), reference=off,
                                         metric="final_max_weight"), (policy,)),
                source="article §6.5"),
            claims_lib.Claim(
                f"Without attention dropout, {name} trains smoothly at no learning rate "
                f">= {large:g}", _arms(claims_lib.Unstable((off,)), (policy,), large),
                source="article §6.5"),
            claims_lib.Claim(
                f"With attention dropout, {name} trains smoothly at some learning rate "
                f">= {large:g}",
                _arms(claims_lib.Unstable((on,), expect_unstable=False), (policy,), large),
                source="article §6.5")]
    out.append(claims_lib.Claim(
        f"Attention dropout prevents divergence: more runs diverge without it than with it at "
        f"LR >= {large:g} (scale 1 and 1/√d_k counted together)",
        _arms(claims_lib.Diverges("more", (off,), on), min_lr=large), source="article §6.5"))
    return out
