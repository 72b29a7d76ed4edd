r"""The central ablation: scale policies × d_k, with the model's width held fixed or not (claim 3).

  python -m scale_ablation.sweep --config=experiments/dk_sweep.py:cpu --workdir=runs/dk_sweep_cpu
  python -m scale_ablation.sweep --config=experiments/dk_sweep.py --workdir=runs/dk_sweep

The article says every scale but 1/√d_k diverged or oscillated within 500 steps. Changing d_k
changes more than the scale's argument, so every d_k point belongs to one of two arms:

- **fixed width**: num_heads × d_k = d_model, the usual Transformer. Parameters and FLOPs stay
  (nearly) constant, so a loss that changes with d_k is the scale's doing, or the head count's.
- **fixed heads**: num_heads is held and the attention width num_heads × d_k grows with d_k, as
  in the first version of this sweep. It reaches the large d_k where the article's argument
  bites, at the price of more parameters: each run's summary and the report give parameters,
  non-embedding parameters, tokens, passes over the data and FLOPs, so the two can be told apart.

A point with num_heads × d_k = d_model belongs to both arms and runs once. Each run's overrides
carry `model.num_heads`, so the report's variants (`none (num_heads=8)`) name the arm's cell.

Variants:
- `cpu` (the study that answers on 2 cores): d_model 128, 600 steps, the article's two named
  alternatives, scale 1 and 1/d_k, against 1/√d_k, 3 seeds, each policy over three LRs ×√10
  apart around its best in the first pass (`CPU_LRS`: 1/√d_k 3e-3, scale 1 1e-3, 1/d_k 1e-2;
  `WIDER` and `WIDER_QK` take the points `--refine` names). Two arms:
  - fixed width (`cpu_fixed_width_arm`): 8 heads × d_k 16 and 1 head × d_k 128, fan_in init:
    54 runs;
  - q/k width (`cpu_qk_width_arm`): 2 heads of value width 64, d_k = `model.qk_dim` 16 and 256,
    both inits: 108 runs. Heads, width and value width are held, so d_k alone moves (the
    parameters change only in the q/k projections, 0.51M to 0.76M).
  162 runs, 6.1e14 train FLOPs (`--plan`), about 2.5 h on 2 idle cores at the ~65 GFLOP/s the
  headline job sustains. The first pass (99 runs, about 3 h; README's results index) had a
  fixed-heads cell of 1 head × d_k 512 instead of the q/k arm, which moved parameters (4×
  attention width) with d_k; and 4 heads at d_k 512 as q/k width would cost 5.8e14 alone, so
  the arm has 2 heads and stops at 256. The other policies (1/log d_k, a constant, learned,
  QK-LayerNorm, log-length) are left to `gpu`: three seeds at three LRs of three policies is
  what fits on 2 cores.
- default (one accelerator): d_model 512 with 8 heads of value width 64, d_k the q/k width
  (`model.qk_dim`) 16, 64, 256, 512: width and heads fixed, so the scale's argument changes
  alone (the q/k projections grow with d_k). 1/√d_k and the article's four alternatives, each
  over 5 LRs ×2 apart around its cpu best (`ACCELERATOR_LRS`), both inits, 3 seeds, 3000 steps
  (0.18 passes over WikiText-103, read from the local copy of the `gpu` base variant).
  Learned, QK-LayerNorm and log-length are left to learned_scale, lr_sensitivity and
  length_generalization, which tune them.
- `quick` (smoke test, one seed, 120 steps): the same two arms at d_model 64, fixed width
  (4 heads × d_k 16, 1 × 64) and fixed heads (1 × 64, 1 × 256), both inits, the default's five
  policies (1/√d_k and the article's four alternatives), each at five LRs (`QUICK_LRS`): 150
  runs. Every one of them is a `policies.scalar` policy, so each of the 6 shapes (cell × init:
  gpt2 adds biases) trains its 25 runs as one ensemble and compiles once (`QUICK_POLICIES`).
  Cold on 2 cores: 4 min 50 s, 21% of it compiling, 22 MB on disk (a completed run keeps no
  checkpoint). The first version, with learned, QK-LayerNorm and log-length too, d_k up to 1024
  and one LR, built 32 shapes for 64 runs: 11.7 min at load ~3-4 (67% compiling, 143 programs),
  581 MB (issue 56; `python -m benchmarks.quick_sweep`,
  benchmarks/results/quick_sweep_cpu-2core_2026-12-06.json).

The init is an axis of `quick` and the default (`model.init`): which scale is best depends on
how q and k start (the article's pitfall 1). `fan_in` gives q and k unit-variance entries at
every d_k, the article's premise; `gpt2` (std 0.02) gives entries of std 0.02·√d_model, so
1/√d_k logits start with std 0.02²·d_model instead of 1, as in the GPT-2-style models most
results are quoted for.

A policy of your own joins the grid at every cell with no edit here (README, "Add your policy and
sweep it"): add `--imports=my_policy.py --add_policies=my_policy` to the sweep command.

Budget (default): 9.27 device-hours on one H200, 600 runs, 1.31e19 train FLOPs
(`python -m scale_ablation.sweep --config=experiments/dk_sweep.py --workdir=DIR --plan
--device=H200`; FLOPs at the planner's assumed 40% MFU until a measured throughput table
exists, compilation not counted; tests/test_planner.py holds it to 25%).
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib

OTHER_SCALES = ("none", "inv_dk", "inv_log_dk", "const:0.1")  # the article's §1 alternatives
POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1", "learned", "qk_layernorm",
            "log_length")
CPU_POLICIES = ("inv_sqrt_dk", "none", "inv_dk")  # the reference and the article's named two
HEAD_DIMS = (16, 64, 256, 1024)  # the fixed-heads arm's d_k (default)
FIXED_HEADS = {"quick": 1, "cpu": 1, None: 8}  # default: the gpu base's 8 heads
# quick's d_k: fixed width 16 and 64 (= d_model), fixed heads 64 and 256, the smallest d_k the
# claims call large; 256, not 1024, keeps a finished run's checkpoint at ~3 MB (1024: ~13 MB).
QUICK_FIXED_WIDTH, QUICK_FIXED_HEADS = (16, 64), (64, 256)
INITS = ("fan_in", "gpt2")  # model.init: the article's unit-variance q/k, and GPT-2's
# Each policy's own LR grid, wide enough that its best is interior: the first cpu run used
# {1e-3, 3e-3, 1e-2} for all and found scale 1's best on the low edge (d_k 128) and 1/d_k's on
# the high edge (d_k 16), so each got one more point on that side.
# The q/k-width arm (cpu): 2 heads of value width 64 at d_model 128, d_k = qk_dim 16 and 256,
# so that the parameters change only in the q/k projections and nothing but d_k moves. Each
# policy's three LRs are centred on its best in the first cpu pass (1/√d_k 3e-3, scale 1
# 1e-3, 1/d_k 1e-2); WIDER_QK[(init, policy, qk_dim)] takes the points `--refine` names.
CPU_QK_HEADS = 2
CPU_QK_DIMS = (16, 256)
CPU_LRS = {"inv_sqrt_dk": (1e-3, 3e-3, 1e-2), "none": (3e-4, 1e-3, 3e-3),
           "inv_dk": (3e-3, 1e-2, 3e-2)}
WIDER_QK: dict[tuple[str, str, int], tuple[float, ...]] = {}
WIDER: dict[tuple[str, int], tuple[float, ...]] = {}
# The default: the article's alternatives against 1/√d_k, d_k as the q/k width of 8 heads of a
# d_model 512 model (the value width stays 64). Each policy's LR grid is centred on its best in
# the cpu study (1/√d_k 3e-3 at d_k 16 and 128; scale 1 1e-3; 1/d_k 1e-2 at d_k 16 and 512), or
# on 1/√d_k's for the two the cpu study did not run (1/log d_k and 0.1 are within 2x of 1/√d_k
# at d_k 16-256), 5 points ×2 apart: interior unless the best moved 4x on the larger model.
ACCELERATOR_POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1")
ACCELERATOR_QK_DIMS = (16, 64, 256, 512)
ACCELERATOR_LRS = {"inv_sqrt_dk": 3e-3, "none": 1e-3, "inv_dk": 1e-2, "inv_log_dk": 3e-3,
                   "const:0.1": 3e-3}
# quick's policies: the default's, all scalar, so that a shape's runs are one ensemble and one
# compiled program; learned, QK-LayerNorm and log-length have quick variants of their own
# (learned_scale.py, lr_sensitivity.py, length_generalization.py).
QUICK_POLICIES = ACCELERATOR_POLICIES
# quick's LRs, one grid for every policy (so that a policy added with --add_policies gets the
# same ones): ×√10 apart, so that each policy's best in the cpu study (scale 1 1e-3, 1/√d_k
# 3e-3, 1/d_k 1e-2) is an interior point, and each is judged at its own best. They also give
# each compiled program 25 runs to train instead of 5: with one LR the cold sweep spent 58% of
# its time compiling, with three 30% (issue 56; benchmarks/README.md).
QUICK_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.model.num_heads = FIXED_HEADS[arg]
    config.wandb.tags = ("dk_sweep",)
    if arg == "quick":
        config.train.steps = 120
        config.train.warmup_steps = 12
        config.train.log_every = 20
        config.train.eval_every = 20
        config.train.diag_every = 40
        config.checkpoint.every = 60
        # A smoke sweep: its 150 final states would take ~300 MB (2 MB a run).
        config.checkpoint.keep_final = False
    elif arg is None:
        config.train.steps = 3000
    return config


def cells(arg: str | None = None) -> list[tuple[int, int]]:
    """(num_heads, d_k) of every point: the fixed-width arm first, then fixed heads, each once."""
    d_model = get_config(arg).model.d_model
    if arg == "cpu":  # the fixed-heads arm is the q/k-width arm (cpu_qk_width_arm)
        fixed_width, fixed_heads_dims = (16, 128), (128,)
    elif arg == "quick":
        fixed_width, fixed_heads_dims = QUICK_FIXED_WIDTH, QUICK_FIXED_HEADS
    else:
        fixed_width = tuple(d for d in (*HEAD_DIMS, d_model) if d <= d_model)
        fixed_heads_dims = HEAD_DIMS
    out = [(d_model // d, d) for d in sorted(set(fixed_width))]
    out += [(FIXED_HEADS[arg], d) for d in fixed_heads_dims]
    return list(dict.fromkeys(out))


def accelerator_sweep() -> list[dict]:
    """The default grid: d_k by q/k width at fixed width and heads, each policy over its own
    LR grid around its located best (ACCELERATOR_LRS), both inits, 3 seeds."""
    return [
        {"policy": policy, "model.qk_dim": qk_dim, "model.init": init, "train.lr": lr,
         "train.seed": seed}
        for init in INITS for policy in ACCELERATOR_POLICIES for qk_dim in ACCELERATOR_QK_DIMS
        for lr in base.lr_grid_around(ACCELERATOR_LRS[policy])
        for seed in base.ACCELERATOR_SEEDS
    ]


def cpu_fixed_width_arm() -> list[dict]:
    """num_heads × d_k = d_model 128: d_k 16 (8 heads) and 128 (1 head), each policy over its
    own LR grid, 3 seeds, the fan_in init."""
    return [
        {"policy": policy, "model.num_heads": heads, "model.head_dim": d_k,
         "train.lr": lr, "train.seed": seed}
        for policy in CPU_POLICIES for heads, d_k in cells("cpu")
        for lr in base.lr_grid_for((policy, d_k), CPU_LRS[policy], WIDER) for seed in (0, 1, 2)
    ]


def cpu_qk_width_arm() -> list[dict]:
    """d_k alone: the q/k width of 2 heads of value width 64 at d_model 128, both inits, each
    policy over three LRs around its located best (CPU_LRS), 3 seeds."""
    return [
        {"policy": policy, "model.num_heads": CPU_QK_HEADS, "model.head_dim": 128 // CPU_QK_HEADS,
         "model.qk_dim": qk_dim, "model.init": init, "train.lr": lr, "train.seed": seed}
        for init in INITS for policy in CPU_POLICIES for qk_dim in CPU_QK_DIMS
        for lr in base.lr_grid_for((init, policy, qk_dim), CPU_LRS[policy], WIDER_QK)
        for seed in (0, 1, 2)
    ]


def sweep(arg: str | None = None) -> list[dict]:
    if arg is None:
        return accelerator_sweep()
    if arg == "cpu":
        return cpu_fixed_width_arm() + cpu_qk_width_arm()
    return [  # quick
        {"policy": policy, "model.num_heads": heads, "model.head_dim": head_dim,
         "model.init": init, "train.lr": lr, "train.seed": 0}
        for init in INITS for policy in QUICK_POLICIES for heads, head_dim in cells(arg)
        for lr in QUICK_LRS
    ]


def _named(specs: tuple[str, ...]) -> str:
    names = {"none": "scale 1", "inv_dk": "1/d_k", "inv_log_dk": "1/log d_k",
             "const:0.1": "a fixed 0.1"}
    listed = [names[spec] for spec in specs]
    text = ", ".join(listed[:-1]) + " and " + listed[-1] if len(listed) > 1 else listed[0]
    return text[0].upper() + text[1:]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    others = tuple(p for p in OTHER_SCALES if p in (CPU_POLICIES if arg == "cpu" else POLICIES))
    large = 128 if arg == "cpu" else 256
    return [
        claims_lib.Claim(
            f"{_named(others)} diverged or oscillated; only 1/√d_k trained smoothly (at large "
            "d_k)",
            claims_lib.Unstable(others, expect_unstable=True, min_d_k=large),
            source="article §1"),
        claims_lib.Claim(
            "At large d_k every other scale ends worse than 1/√d_k",
            claims_lib.Compare("worse", policies=others, at="best_lr", min_d_k=large),
            source="article §1"),
    ]
