r"""Pitfall 3: logits in low precision. Does the unscaled run overflow, and do float32 logits cure it?

  python -m scale_ablation.sweep --config=experiments/precision.py:cpu --workdir=runs/precision_cpu
  python -m scale_ablation.sweep --config=experiments/precision.py:quick --workdir=runs/precision_quick

Compute dtype float16 / bfloat16 (and float32 on an accelerator) × logits kept in float32 or in
the activation dtype (`model.logits_dtype`) × `none` vs `inv_sqrt_dk`, and float16 run three
ways. float16 overflows above 65504 (the report's max-logit plots draw that line when the sweep
has float16 runs); bfloat16 has float32's range but 8 bits of mantissa. float32 compute with
"activation" logits is the same as float32 logits, so it is left out.

How float16 is run. The second cpu study (below) found float16 runs with float32 logits diverge
as often as with float16 ones, every one of them by the residual stream's `x + attended` passing
65504: all-float16 training tests the stream as much as the logits. Mixed precision as it is
practised (Micikevicius et al. 2018; PyTorch's autocast) keeps the stream in float32 and scales
the loss, so the study has three float16 recipes (`PLAIN`, `MIXED`, `STREAM_ONLY`):
- as before: everything in float16, no loss scaling;
- as practised: the residual stream, its norms and additions in float32
  (`model.residual_dtype = "float32"`), every matmul in float16, and a dynamic loss scale
  (`train.loss_scale_period`; from 2^15, halved with the step skipped on a non-finite gradient,
  doubled after 200 finite steps, where jmp and PyTorch double after 2000 in runs of ~10^5
  steps: at that pace a 600-step run could never grow back). The attention logits, when kept
  in float16, are then the only float16 path whose values can grow with the scale: the article's
  claim is tested with the stream's overflow taken out;
- the float32 stream without the loss scale, 1/√d_k and float32 logits only: against the
  recipe as practised it says what the loss scale adds.
The accelerator runs float16 only as practised; float32 is its control.

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
replaced it, has 38 and 566, 557 and 5.1·10^3, 1.7·10^4 and 1.3·10^5 at the same LRs. The cpu
arms run at 1.78e-2 and 6.81e-2 (and, since the third study, 4.64e-3 and 9.1e-3): the divergence
counts are taken at the two large LRs, the final losses compared at each LR >= 4e-3
(`PRECISION_MIN_LR`), paired by seed, policy and LR. 0.261 is left out: single cpu runs of
`none` in float16 diverged there after ~40 steps with either logits dtype.

What overflows. The first cpu study (72 runs at `52c945e`) had every float16 run at LR >= 1.78e-2
diverge, with float16 and float32 logits alike, and the logits below 65504: it was the MLP's
tanh-GELU, whose derivative overflows float16 for |z| >= 148 (NaN gradients, finite loss). Since
`4471490` the GELU runs in float32; the second study (72 runs at `3864970`) then found the
residual stream overflowing instead, which is why the recipes above exist. What still overflows
is named, run by run, by `python -m scale_ablation.nonfinite runs/precision_cpu` (the README's
Results quote it; it replays the unscaled loss, so a loss-scaled run's replay shows the
overflow of a scale-1 step).

Variants:
- `cpu` (2 cores): the base CPU model (4 heads × d_k 32, 600 steps). The third study (78 runs,
  LRs 1.78e-2 and 6.81e-2 only) returned no verdict: nothing learns there, float32 included
  (its attention collapses; lr_sensitivity_cpu), so the sweep gate held every claim back, and
  "trains smoothly" cannot separate float16 from the LR. So: a float32 control and LRs 4.64e-3
  and 9.1e-3 (healthy in float32, logits past 10^2) beside the two large ones for the
  as-practised and bfloat16 cells; float16 as before at the large LRs only (its stream
  overflows); five seeds in the cells the divergence counts use (both policies in the
  stream-only cell), since one policy's 3 of 3 against 0 of 3 is Fisher p = 0.1: 196 runs,
  of which the third study's 78 are part; 1.99 h summed over 13 ensembles on 2 cores, 5.78e14
  train FLOPs (the published fourth study).
- default (one accelerator): the gpu model with d_k 256 and 1024 as the q/k width of 8 heads,
  float32, the two bfloat16 arms and float16 as practised with both logits dtypes, LRs 1e-3,
  6.49e-3, 4.87e-2 and 0.133, 3 seeds, 3000 steps: 240 runs.
- `quick` (smoke): d_k 256 on the quick model, every cpu cell, LRs 4.64e-3 and 6.81e-2, one seed.

Budget (default): 7.92 device-hours on one H200, 240 runs, 9.23e18 train FLOPs
(`python -m scale_ablation.sweep --config=experiments/precision.py --workdir=DIR --plan
--device=H200`; FLOPs at the planner's assumed 40% MFU until a measured throughput table
exists, compilation not counted; tests/test_planner.py holds it to 25%).
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib

POLICIES = ("none", "inv_sqrt_dk")
LOSS_SCALE_PERIOD = 200  # a dynamic scale doubles after this many finite steps (docstring)
# How the compute dtype is run (each a set of overrides): as before (the stream in the compute
# dtype, no loss scale), float16's mixed precision as practised (float32 stream, dynamic loss
# scale from 2^15), and the float32 stream without the loss scale.
PLAIN = {"model.residual_dtype": "", "train.loss_scale_period": 0}
MIXED = {"model.residual_dtype": "float32", "train.loss_scale_period": LOSS_SCALE_PERIOD}
STREAM_ONLY = {"model.residual_dtype": "float32", "train.loss_scale_period": 0}
BOTH_LOGITS = ("float32", "activation")
LARGE_LRS = (1.78e-2, 6.81e-2)  # where the logits grow past ~10^3 (docstring)
CPU_LRS = (4.64e-3, 9.1e-3, *LARGE_LRS)  # and two where float32 trains healthily
# (compute dtype, recipe, logits dtypes, scale policies, LRs, seeds): the cpu cells.
# float32 is the control; float16 as before stays at the large LRs (its answer is known: the
# stream overflows); the cells the divergence claims count get five seeds, since at three
# 3 of 3 against 0 of 3 is Fisher p = 0.1 (docstring).
CPU_CELLS = (("float32", PLAIN, ("float32",), POLICIES, CPU_LRS, (0, 1, 2)),
             ("float16", PLAIN, BOTH_LOGITS, POLICIES, LARGE_LRS, (0, 1, 2)),
             ("float16", MIXED, BOTH_LOGITS, POLICIES, CPU_LRS, (0, 1, 2, 3, 4)),
             ("float16", STREAM_ONLY, ("float32",), POLICIES, LARGE_LRS, (0, 1, 2, 3, 4)),
             ("bfloat16", PLAIN, BOTH_LOGITS, POLICIES, CPU_LRS, (0, 1, 2)))
# The accelerator runs float16 only as it is practised; float32 is the control.
GPU_CELLS = (("float32", PLAIN, ("float32",), POLICIES), ("bfloat16", PLAIN, BOTH_LOGITS, POLICIES),
             ("float16", MIXED, BOTH_LOGITS, POLICIES))
LRS = {"quick": (4.64e-3, 6.81e-2), None: (1e-3, 6.49e-3, 4.87e-2, 0.133)}  # 1e-3: a floor
# "Large learning rates": where max |logit| passes ~10^2 (scale 1's reached 528 at 4.64e-3).
PRECISION_MIN_LR = 4e-3


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("precision",)
    config.model.attention_impl = "reference"  # both arms on one path (docstring)
    config.train.diag_every = {"quick": 20, "cpu": 25}.get(arg, 100)  # logit growth over time
    if arg is None:
        config.train.steps = 3000  # the budget (docstring): 0.18 passes over WikiText-103
    if arg == "cpu":
        config.data.test_bytes = 128 * 1024  # the docstring's budget (as lr_sensitivity:cpu)
    return config


def _cells(arg: str | None) -> tuple:
    """(dtype, recipe, logits dtypes, policies, LRs, seeds) of the variant."""
    if arg == "cpu":
        return CPU_CELLS
    seeds = (0,) if arg == "quick" else base.ACCELERATOR_SEEDS
    cells = GPU_CELLS if arg is None else CPU_CELLS
    return tuple((*cell[:4], LRS[arg], seeds) for cell in cells)


def sweep(arg: str | None = None) -> list[dict]:
    if arg is None:  # d_k as the q/k width of 8 heads at d_model 512
        shapes = [{"model.qk_dim": d_k} for d_k in (256, 1024)]
    else:
        shapes = [{"model.head_dim": {"quick": 256, "cpu": 32}[arg]}]
    return [{"train.dtype": dtype, "model.logits_dtype": logits_dtype, **recipe,
             "policy": policy, **shape, "train.lr": lr, "train.seed": seed}
            for dtype, recipe, logits, policies, lrs, seeds in _cells(arg)
            for logits_dtype in logits for policy in policies for shape in shapes
            for lr in lrs for seed in seeds]


def _where(dtype: str, recipe: dict) -> tuple[tuple[str, object], ...]:
    return (("train.dtype", dtype), *recipe.items())


def _arms(rule, dtype: str, recipe: dict, policies: tuple[str, ...],
          min_lr: float = PRECISION_MIN_LR) -> claims_lib.Arms:
    return claims_lib.Arms(rule, field="model.logits_dtype", where=_where(dtype, recipe),
                           policies=policies, min_lr=min_lr)


def _float16_claims(recipe: dict, how: str) -> list[claims_lib.Claim]:
    """The article's float16 claims, for float16 run as `recipe` (`how`, in words). Overflow
    and its cure are one count: divergences at the large LRs, float16 logits against float32
    ones, both scale policies together (at five seeds each, 10 of 10 against 0 of 10 is
    Fisher p = 1e-5; one policy's 5 of 5 against 0 of 5, p = 0.008, does not survive Holm over
    the study's ~30 tests). Entropy collapse, which every dtype shows at these LRs, is no
    divergence and does not enter."""
    overflow = claims_lib.Diverges("more", ("activation",), "float32")
    low_worse = claims_lib.Compare("worse", policies=("activation",), reference="float32",
                                   at="each_lr")
    same = claims_lib.Compare("indistinguishable", policies=("activation",),
                              reference="float32", at="each_lr")
    return [
        claims_lib.Claim("float16 logits overflow at large learning rates and float32 logits "
                         "cure it: more runs diverge with float16 logits than with float32 "
                         "ones (scale 1 and 1/√d_k counted together)" + how,
                         _arms(overflow, "float16", recipe, POLICIES, min_lr=LARGE_LRS[0]),
                         source="article, pitfall 3"),
        claims_lib.Claim("Without the scale, float16 logits end worse than float32 logits at "
                         "large learning rates" + how, _arms(low_worse, "float16", recipe,
                                                             ("none",)),
                         source="article, pitfall 3"),
        claims_lib.Claim("With 1/√d_k, float16 logits end as well as float32 logits at large "
                         "learning rates" + how, _arms(same, "float16", recipe, ("inv_sqrt_dk",)),
                         source="article, pitfall 3")]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    low_worse = claims_lib.Compare("worse", policies=("activation",), reference="float32",
                                   at="each_lr")
    bfloat16 = claims_lib.Claim(
        "bfloat16 logits (float32's range, 8 bits of mantissa) end worse than float32 logits "
        "at large learning rates", _arms(low_worse, "bfloat16", PLAIN, ()),
        source="article, pitfall 3")
    mixed = _float16_claims(MIXED, " (float16 as practised: float32 residual stream, dynamic "
                                   "loss scale; the logits the only float16 path left)")
    if arg is None:  # the accelerator runs float16 only as practised
        return [*mixed, bfloat16]
    needs_scaling = claims_lib.Claim(
        "float16 training needs loss scaling: with a float32 residual stream and float32 "
        "logits, more runs diverge at large learning rates without a loss scale than with a "
        "dynamic one (scale 1 and 1/√d_k counted together)",
        claims_lib.Arms(claims_lib.Diverges("more", ("0",), str(LOSS_SCALE_PERIOD)),
                        field="train.loss_scale_period",
                        where=(("train.dtype", "float16"), ("model.residual_dtype", "float32"),
                               ("model.logits_dtype", "float32")), min_lr=LARGE_LRS[0]),
        source="mixed-precision practice (Micikevicius et al. 2018)")
    return [*_float16_claims(PLAIN, ""), bfloat16, *mixed, needs_scaling]
