r"""The article's §3.3: unscaled logits at large d_k overflow in float16. Float16 logits as
practised against float32 logits, with d_k (the q/k width alone) growing (issue 54).

  python -m scale_ablation.sweep --config=experiments/precision_dk.py:cpu \
      --workdir=runs/precision_dk_cpu
  python -m scale_ablation.report runs/precision_dk_cpu

Design. Every run is float16 as it is practised (precision.py's `MIXED`): the residual stream,
its norms and additions in float32, every matmul in float16, a dynamic loss scale from 2^15;
the arms differ in `model.logits_dtype` alone, float16 logits (`activation`) against float32
ones. The precision study ran this at d_k 32 only, where all 10 float16-logit runs diverged at
LR 6.81e-2 (the first inf in the q·k product or the softmax) and none with float32 logits. Here
d_k is the q/k width per head (`model.qk_dim` 16 … 256, as in dk_exponent) at fixed d_model,
heads and value width, so the parameters change only in the q and k projections. The scale
multiplies after q·k (`attention._Dense`), so what can overflow is the product itself: at
init (fan_in) its std is √d_k, and with 1/√d_k the post-scale logits the model learns are
√d_k times smaller than the product. 1/√d_k and scale 1 (`none`), each over LRs 4.64e-3
(healthy: the sweep learns there, so it can give verdicts, and nothing should diverge), 3.48e-2
and 6.81e-2 (precision_cpu's largest; 3.48e-2 is the geometric midpoint of its 1.78e-2, where
nothing diverged at d_k 32, and 6.81e-2). Both scale policies and every LR and seed of one
(d_k, logits dtype) share one compiled program: 10 ensembles of 18. All runs take the
reference attention path (precision.py: the fused kernel cannot keep float16 logits). No
`--refine`: the claims count divergences at fixed LRs.

Calibration before the study (single runs, seed 0, 1/√d_k, float16 logits, this cpu config):
at d_k 32 LR 6.81e-2 diverged at step 106 (largest post-scale logit 1.1·10⁴ at step 100, so
q·k ≈ 6.3·10⁴), at 3.48e-2 it completed (3.6·10³, q·k ≈ 2·10⁴); at d_k 16 6.81e-2 diverged
later, at step 205; at d_k 256 3.48e-2 diverged at step 109 (3.4·10³ post-scale, q·k ≈
5.4·10⁴). At 4.64e-3 d_k 32 ended at 2.755 bits per byte (bigram 3.59).

Claims (divergence counts, Fisher's exact test per (d_k, LR), both scale policies and the three
seeds pooled: 6 runs an arm, where 6 of 6 against 0 of 6 is p = 0.0022 and survives Holm over
the family's 15 tests; one policy's 3 of 3 against 0 of 3 is p = 0.1 and never could, so the
claims pool the policies and summary.md gives each policy's cells):
- per d_k, float16 logits diverge in more runs than float32 logits (`Diverges` over the arms of
  `model.logits_dtype`, that d_k's runs alone). Its reason names the LRs where the counts
  decide it.
- the overflow grows with d_k, as one test across the d_k (`Trend`): the share of float16-logit
  runs at LR >= 3.48e-2 that diverge grows with d_k (both policies, both LRs and the seeds
  pooled: 12 runs a d_k; the exact conditional trend test over the five d_k in order).
- the growth at its two ends as computed verdicts (`Unstable` narrowed to `diverged`, float16
  logits alone, LR >= 3.48e-2, the LR and the d_k chosen from the calibration above): at the
  largest d_k every such LR has a diverged run, and at the smallest one such LR has none.
Scale 1 starts with logit std √d_k under fan_in, ≥ 8 from d_k 64: the at-init rule
(`analysis/at_init.py`) then marks those d_k's claims "partly decided at init". The arms the
claims compare, the two logits dtypes, start identical (the dtype changes no parameter), so the
mark says how scale 1 starts, not that the divergence counts were known at step 0.

Variants:
- `cpu` (2 cores): dk_exponent:cpu's model and batch (d_model 128, 2 layers, 4 heads of value
  width 32, 16 × 64 bytes) for precision_cpu's 600 steps, which its divergences (steps 114–224
  at 6.81e-2) need; 5 d_k × 2 logits dtypes × 2 policies × 3 LRs × 3 seeds = 180 runs,
  3.87e14 train FLOPs (`--plan`). precision_cpu's 128-byte windows at 600 steps would be
  7.95e14, ~2.5 h; at the rate precision_cpu ran (its plan's 6.67e14 FLOPs in 1.99 h on 2
  idle cores, 93 GFLOP/s) this is ~1.2 h. `--plan` assumes 40% of a matmul peak it measures
  at the time: 1.4 h at precision's idle 201 GFLOP/s, 3.0 h at the 92 it measured on the
  loaded machine.
- default (one accelerator): d_model 512, 4 layers, 8 heads of value width 64, d_k 16 … 1024
  (×4), 3000 steps × 64 × 512 bytes of WikiText-103, LRs 6.49e-3 … 0.133, 3 seeds: 192 runs,
  2.58e18 train FLOPs, 1.88 device-hours on one H200 (`--plan --device=H200`, 40% MFU assumed).
- `quick` (tests): the quick model, d_k 16 and 256, LRs 4.64e-3 and 6.81e-2, one seed.
"""

from experiments import base, precision
from scale_ablation.analysis import claims as claims_lib

POLICIES = ("none", "inv_sqrt_dk")
LOGITS = ("activation", "float32")  # float16 logits (the activations' dtype) against float32
# model: (d_model, heads, value width, layers); train: (steps, batch, seq_len); q/k widths; LRs;
# seeds; the smallest LR of the growth claims.
SIZES = {
    "quick": ((64, 2, 32, 2), (60, 8, 64), (16, 256), (4.64e-3, 6.81e-2), (0,), 6.81e-2),
    "cpu": ((128, 4, 32, 2), (600, 16, 64), (16, 32, 64, 128, 256), (4.64e-3, 3.48e-2, 6.81e-2),
            (0, 1, 2), 3.48e-2),
    None: ((512, 8, 64, 4), (3000, 64, 512), tuple(16 * 4**k for k in range(4)),
           (6.49e-3, 2.4e-2, 4.87e-2, 0.133), base.ACCELERATOR_SEEDS, 4.87e-2),
}


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    (d_model, heads, value, layers), (steps, batch, seq_len), *_ = SIZES[arg]
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("precision_dk",)
    m, t = config.model, config.train
    m.d_model, m.num_heads, m.head_dim, m.num_layers = d_model, heads, value, layers
    config.data.seq_len, t.steps, t.batch_size = seq_len, steps, batch
    m.attention_impl = "reference"  # both arms on one path (precision.py)
    t.dtype = "float16"  # float16 as practised: float32 stream, dynamic loss scale
    m.residual_dtype = precision.MIXED["model.residual_dtype"]
    t.loss_scale_period = precision.MIXED["train.loss_scale_period"]
    t.warmup_steps = {"quick": 10, "cpu": 50}.get(arg, 300)
    t.diag_every = {"quick": 20, "cpu": 25}.get(arg, 100)  # logit growth over time
    t.eval_every, config.checkpoint.every = steps // 4, steps // 2
    config.data.test_bytes = {"quick": 0, "cpu": 32 * 1024}.get(arg, 256 * 1024)
    return config


def sweep(arg: str | None = None) -> list[dict]:
    _, _, qk_dims, lrs, seeds, _ = SIZES[arg]
    return [{"model.logits_dtype": logits, "model.qk_dim": qk_dim, "policy": policy,
             "train.lr": lr, "train.seed": seed}
            for qk_dim in qk_dims for logits in LOGITS for policy in POLICIES
            for lr in lrs for seed in seeds]


def _at(rule, qk_dim: int, min_lr: float = 0.0) -> claims_lib.Arms:
    """`rule` over the logits dtypes' arms of one d_k's runs."""
    return claims_lib.Arms(rule, field="model.logits_dtype", where=(("model.qk_dim", qk_dim),),
                           policies=POLICIES, min_lr=min_lr)


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    _, _, qk_dims, _, _, growth_lr = SIZES[arg]
    how = ("(float16 as practised: float32 residual stream, dynamic loss scale; scale 1 and "
           "1/√d_k counted together)")
    overflow = claims_lib.Diverges("more", ("activation",), "float32")
    out = [claims_lib.Claim(
        f"At d_k {qk_dim}, float16 logits overflow where float32 logits do not: more runs "
        f"diverge with float16 logits than with float32 ones {how}", _at(overflow, qk_dim),
        source="article §3.3, pitfall 3") for qk_dim in qk_dims]
    diverged = ("diverged",)
    growth = claims_lib.Arms(claims_lib.Trend("grows", ("activation",)),
                             field="model.logits_dtype", policies=POLICIES, min_lr=growth_lr)
    out += [
        claims_lib.Claim(
            f"The overflow grows with d_k: the share of runs with float16 logits that diverge "
            f"at learning rates >= {growth_lr:g} grows with d_k {how}", growth,
            source="article §3.3"),
        claims_lib.Claim(
            f"The overflow grows with d_k: at d_k {qk_dims[-1]} float16 logits diverge at every "
            f"learning rate >= {growth_lr:g} {how}",
            _at(claims_lib.Unstable(("activation",), kinds=diverged), qk_dims[-1], growth_lr),
            source="article §3.3"),
        claims_lib.Claim(
            f"The overflow grows with d_k: at d_k {qk_dims[0]} float16 logits have a learning "
            f"rate >= {growth_lr:g} at which no run diverges {how}",
            _at(claims_lib.Unstable(("activation",), expect_unstable=False, kinds=diverged),
                qk_dims[0], growth_lr),
            source="article §3.3")]
    return out
