r"""Pitfall 3: logits in low precision. Does the unscaled run overflow, and do float32 logits cure it?

  python -m scale_ablation.sweep --config=experiments/precision.py:cpu --workdir=runs/precision_cpu
  python -m scale_ablation.sweep --config=experiments/precision.py:quick --workdir=runs/precision_quick

Compute dtype float16 / bfloat16 (and float32 on an accelerator) × logits kept in float32 or in
the activation dtype (`model.logits_dtype`) × `none` vs `inv_sqrt_dk`. float16 overflows above
65504 (the report's max-logit plots draw that line when the sweep has float16 runs); bfloat16
has float32's range but 8 bits of mantissa. float32 compute with "activation" logits is the same
as float32 logits, so it is left out. float16 runs use no loss scaling: that is part of what is
measured.

One attention path for both arms. The fused path (`jax.nn.dot_product_attention`, cuDNN on a
GPU) computes q·k and the softmax at a precision the kernel picks (float32 accumulation inside
cuDNN), so it cannot keep logits in float16; `attend` sends activation-dtype logits to the
reference path instead. With `attention_impl = "fused"` (the gpu base) the two arms would then
differ in kernel as well as in logits dtype. Every variant here pins `attention_impl =
"reference"`, where `logits_dtype` alone decides the logits' dtype (float32 via
`preferred_element_type`, or the activations' own), so the arms differ in that and nothing else.

Learning rates where the logits grow. The LRs were chosen from the first LR-sensitivity report
(`lr_sensitivity.py:quick`, seed 0, 100 steps: max |logit| of `inv_sqrt_dk` and `none` 16 and
109 at LR 4.6e-3, 88 and 534 at 0.018, 1.5·10^3 and 7.8·10^3 at 0.068); its cpu study, which
replaced it, has 38 and 566, 557 and 5.1·10^3, 1.7·10^4 and 1.3·10^5 at the same LRs. The arms
run at 4.64e-3 (near the best LR: the runs must learn), 1.78e-2 and 6.81e-2, and the claims
compare them at each LR >= 0.015 (`PRECISION_MIN_LR`), paired by seed, policy and LR. 0.261 is
left out: single cpu runs of `none` in float16 diverged there after ~40 steps with either logits
dtype.

What overflows. The first cpu study (72 runs at `52c945e`) had every float16 run at LR >= 1.78e-2
diverge, with float16 and float32 logits alike, and the logits below 65504: it was the MLP's
tanh-GELU, whose derivative overflows float16 for |z| >= 148 (NaN gradients, finite loss). Since
`4471490` the GELU runs in float32, and the published report is the rerun. What still overflows
is named, run by run, by `python -m scale_ablation.nonfinite runs/precision_cpu` (the README's
Results quote it).

Variants:
- `cpu` (2 cores): the base CPU model (4 heads × d_k 32, 600 steps); float16 and bfloat16 × two
  logits dtypes × two policies × three LRs × 3 seeds = 72 runs. On this CPU XLA's float16 and
  bfloat16 steps run at 80–90% of float32's speed once compiled (100 steps of `none` at LR 0.07,
  logits in the activation dtype, on 2 loaded cores: 2,370, 2,180 and 2,670 tokens/s for
  float16, bfloat16 and float32), so a run costs ~50–55 s alone, and the float16 runs that
  diverge stop early: about an hour. The float32-compute arm (everything in float32, the control
  of both low-precision dtypes) is left to the accelerator.
- default (one accelerator): the gpu model with d_k 256 and 1024 as the q/k width of 8 heads,
  float32 and the two bfloat16 arms (no float16: without loss scaling, which the codebase does
  not have, float16 training is not what is practised), LRs 1e-3, 6.49e-3, 4.87e-2 and 0.133,
  3 seeds, 3000 steps.
- `quick` (smoke): d_k 256 on the quick model, LRs 4.64e-3 and 6.81e-2, one seed.

Budget (default): 3.91 device-hours on one H200, 144 runs, 5.54e18 train FLOPs
(`python -m scale_ablation.sweep --config=experiments/precision.py --workdir=DIR --plan
--device=H200`; FLOPs at the planner's assumed 40% MFU until a measured throughput table
exists, compilation not counted; tests/test_planner.py holds it to 25%).
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib

ARMS = (("float16", "float32"), ("float16", "activation"),
        ("bfloat16", "float32"), ("bfloat16", "activation"))
# float16 needs loss scaling to train as it is practised, and the codebase has none: the
# default keeps float32 and the two bfloat16 arms.
GPU_ARMS = (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "activation"))
POLICIES = ("none", "inv_sqrt_dk")
LRS = {"quick": (4.64e-3, 6.81e-2), "cpu": (4.64e-3, 1.78e-2, 6.81e-2),
       None: (1e-3, 6.49e-3, 4.87e-2, 0.133)}  # 1e-3: below scale 1's cpu best, as a floor
PRECISION_MIN_LR = 0.015  # "large learning rates": max |logit| past ~10^2


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("precision",)
    config.model.attention_impl = "reference"  # both arms on one path (docstring)
    config.train.diag_every = {"quick": 20, "cpu": 25}.get(arg, 100)  # logit growth over time
    if arg is None:
        config.train.steps = 3000  # the budget (docstring): 0.18 passes over WikiText-103
    return config


def sweep(arg: str | None = None) -> list[dict]:
    if arg is None:  # d_k as the q/k width of 8 heads at d_model 512
        return [{"train.dtype": dtype, "model.logits_dtype": logits_dtype, "policy": policy,
                 "model.qk_dim": qk_dim, "train.lr": lr, "train.seed": seed}
                for dtype, logits_dtype in GPU_ARMS for policy in POLICIES
                for qk_dim in (256, 1024) for lr in LRS[arg] for seed in base.ACCELERATOR_SEEDS]
    head_dims = {"quick": (256,), "cpu": (32,)}[arg]
    seeds = (0,) if arg == "quick" else (0, 1, 2)
    return [{"train.dtype": dtype, "model.logits_dtype": logits_dtype, "policy": policy,
             "model.head_dim": head_dim, "train.lr": lr, "train.seed": seed}
            for dtype, logits_dtype in ARMS
            for policy in POLICIES for head_dim in head_dims
            for lr in LRS[arg] for seed in seeds]


def _arms(rule, dtype: str, policies: tuple[str, ...]) -> claims_lib.Arms:
    return claims_lib.Arms(rule, field="model.logits_dtype", where=(("train.dtype", dtype),),
                           policies=policies, min_lr=PRECISION_MIN_LR)


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    low_worse = claims_lib.Compare("worse", policies=("activation",), reference="float32",
                                   at="each_lr")
    same = claims_lib.Compare("indistinguishable", policies=("activation",),
                              reference="float32", at="each_lr")
    float16 = [
        claims_lib.Claim(
            "Without the scale, float16 logits overflow at large learning rates: the runs "
            "diverge, spike or collapse", _arms(claims_lib.Unstable(("activation",)),
                                                "float16", ("none",)),
            source="article, pitfall 3"),
        claims_lib.Claim(
            "Float32 logits cure it: the same float16 runs with float32 logits train smoothly "
            "at some large learning rate",
            _arms(claims_lib.Unstable(("float32",), expect_unstable=False), "float16",
                  ("none",)), source="article, pitfall 3"),
        claims_lib.Claim(
            "Without the scale, float16 logits end worse than float32 logits at large learning "
            "rates", _arms(low_worse, "float16", ("none",)), source="article, pitfall 3"),
        claims_lib.Claim(
            "With 1/√d_k, float16 logits end as well as float32 logits at large learning rates",
            _arms(same, "float16", ("inv_sqrt_dk",)), source="article, pitfall 3"),
    ]
    bfloat16 = [
        claims_lib.Claim(
            "bfloat16 logits (float32's range, 8 bits of mantissa) end worse than float32 "
            "logits at large learning rates", _arms(low_worse, "bfloat16", ()),
            source="article, pitfall 3"),
    ]
    return (float16 if arg is not None else []) + bfloat16  # the default has no float16
