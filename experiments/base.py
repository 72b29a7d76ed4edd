r"""A small byte-level LM on the embedded Shakespeare corpus; every experiment starts from it.

  python -m scale_ablation.main --config=experiments/base.py --workdir=runs/base
  python -m scale_ablation.main --config=experiments/base.py:quick --workdir=runs/base_quick \
      --config.policy=none --config.model.head_dim=256

Variants: default (learns visibly in a couple of minutes on a 2-core CPU), `quick` (tests and
smoke checks: seconds), `cpu` (one run of a CPU study: ~1 min on 2 cores, ends well below the
bigram baseline's bits per byte), `gpu` (one accelerator; streams WikiText-103 so that its
token budget reads a fraction of one pass). The CPU variants read the Shakespeare plays.
"""

import os
from collections.abc import Hashable, Mapping

import ml_collections

VARIANTS = ("quick", "cpu", "gpu")


def check_variant(experiment_file: str, arg: str | None,
                  variants: tuple[str, ...] = VARIANTS) -> None:
    """A typo in the variant must not silently launch the full-size experiment; neither may a
    variant the experiment has not sized (`variants`: the ones it has)."""
    if arg not in (None, *variants):
        name = os.path.basename(experiment_file)
        raise ValueError(f"experiments/{name}: unknown variant {arg!r} ({', '.join(variants)})")


# The accelerator variants' corpus: WikiText-103 in the hub's layout, relative to the directory
# the commands run in (the repository root), made with the README's snapshot_download command.
LOCAL_WIKITEXT = "corpora/wikitext"
ACCELERATOR_SEEDS = (0, 1, 2)  # every accelerator study: a CI over seeds for each setting


def lr_grid_around(centre: float, points: int = 5, factor: float = 2.0) -> tuple[float, ...]:
    """`points` learning rates `factor` apart with `centre` in the middle (odd `points`): the
    accelerator studies' grid around a setting's best LR located on a CPU study, so that the
    best is interior unless it moved by more than factor^(points // 2) on the larger model."""
    half = points // 2
    return tuple(float(f"{centre * factor ** (i - half):.3g}") for i in range(points))


def lr_grid_for(setting: Hashable, base_lrs: tuple[float, ...],
                widened: Mapping[Hashable, tuple[float, ...]]) -> tuple[float, ...]:
    """A setting's LR grid: the study's base grid plus the points `widened` adds for it, in
    ascending order. A study widens a setting's grid where its best LR sat on an edge, so that
    the best is interior; keeping the additions apart says which they were and why."""
    return tuple(sorted({*base_lrs, *widened.get(setting, ())}))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant(__file__, arg)
    config = ml_collections.ConfigDict()
    config.policy = "inv_sqrt_dk"  # scale policy spec, see `scale_ablation.model.policies.available()`
    config.layer_policies = ""  # optional per-layer specs, comma-separated; overrides `policy`

    config.model = model = ml_collections.ConfigDict()
    model.d_model = 128
    model.num_layers = 2
    model.num_heads = 4
    model.head_dim = 32  # d_k, independent of d_model
    model.mlp_ratio = 4
    model.norm = "layernorm"  # layernorm | rmsnorm
    model.norm_position = "pre"  # pre | post (post is the article's pitfall 2 placement)
    model.positions = "learned"  # learned | rotary
    model.max_seq_len = 1024  # learned position table size; data.seq_len may not exceed it
    model.init = "fan_in"  # fan_in (Var(q) independent of d_k) | xavier (fan_avg) | gpt2 (0.02)
    model.init_gain = 1.0  # extra gain on the q/k projections (the article's pitfall 1)
    model.logits_dtype = "float32"  # float32 | activation (keep bf16/fp16 logits: pitfall 3)
    # The two precision switches apart (MaxText's float32_qk_product / float32_logits): the dtype
    # q·k accumulates and is scaled in, and the dtype entering the softmax; "" = logits_dtype,
    # which so still sets both (configs written before the split mean what they meant).
    model.qk_product_dtype = ""  # "" | float32 | activation
    model.softmax_dtype = ""  # "" | float32 | activation
    model.qk_dim = 0  # q/k width per head, the d_k policies see; 0 = head_dim (the v width)
    # The residual stream's dtype: "" = train.dtype; "float32" keeps the stream, norms and
    # additions in float32 with the blocks' matmuls in train.dtype (mixed precision as practised).
    model.residual_dtype = ""
    model.attention_dropout = 0.0
    model.attention_impl = "reference"  # reference | fused (jax.nn.dot_product_attention) | blocked | auto
    # μP (README, "μP"): sp | mup, relative to a base width (0: the model's own).
    model.parametrization = "sp"
    model.base_d_model = 0
    model.base_head_dim = 0
    model.readout_zero_init = False  # mup: an untied readout initialised at zero
    # CompleteP (model/depth.py): residual branches × (L/L_base)^-α, α in [0.5, 1]; 0 = off.
    model.depth_alpha = 0.0
    model.base_num_layers = 1  # L_base, the depth the multipliers are relative to

    config.data = data = ml_collections.ConfigDict()
    data.source = "shakespeare"  # shakespeare | text:PATH_OR_GLOB | mqar | hf:NAME[:CONFIG]
    data.seq_len = 128
    data.val_batches = 4
    # The test split (scale_ablation/data/heldout.py): bytes (MQAR: tokens) scored once, at the
    # end, on held-out text sharing no byte with validation, which alone chooses LR and steps.
    # 256 KiB: at the cpu settings its own standard error is 0.005 bits per byte (a trained
    # model's per-window spread, 0.23, over 2,048 windows), below every CPU study's noise floor
    # (0.008-0.028); the 8 KB validation set's is 0.029. 0 disables it. Not an identity field:
    # runs made before it existed resume (training/run_config.py, NOT_IDENTITY_FIELDS).
    data.test_bytes = 256 * 1024
    data.mqar_num_pairs = 8  # key/value pairs per MQAR sequence (data.MQAR)
    # MQAR ids, even, <= 8192: keys 1..V/2-1, values V/2..V-1; the model's vocabulary on MQAR.
    # Optional `data.mqar_power_a` (Zoology's 0.01) is set by experiments/mqar.py, not here, so
    # the data settings of runs made before it existed are unchanged (they must match to resume).
    data.mqar_vocab_size = 64

    config.train = train = ml_collections.ConfigDict()
    train.steps = 600
    train.batch_size = 16
    train.lr = 3e-3
    train.warmup_steps = 50  # 0 disables warmup
    train.grad_clip = 1.0  # global-norm clip; 0 disables clipping
    train.weight_decay = 0.1
    train.scale_lr_multiplier = 1.0  # the scale policy's parameters' LR, in units of train.lr
    train.z_loss = 0.0
    train.seed = 0
    train.dtype = "float32"  # compute dtype: float32 | bfloat16 | float16 (params stay float32)
    # Loss scaling for float16 (training/loss_scaling.py): 0 = none; S > 0 = static S; with a
    # period N > 0 dynamic from S (0: 2**15), x2 after N finite steps, /2 and skip on overflow.
    train.loss_scale = 0.0
    train.loss_scale_period = 0
    train.log_every = 50
    # Train steps per dispatched program (a power of two; 1 = one program per step). On an
    # accelerator whose host takes longer to launch a step than the device to run it, 8 or 16
    # keeps the device busy (benchmarks/gpu_check.sh); chunks end where a hook reads the state.
    train.steps_per_call = 1
    train.eval_every = 200
    train.diag_every = 100  # 0 disables attention diagnostics
    train.eval_seq_lens = ()  # extra validation lengths (e.g. 2n, 4n): `val/loss@LEN`
    train.fsdp = 1  # devices per FSDP group (parameters and optimiser state split); 1 = pure DP
    train.compilation_cache = True  # persistent XLA cache beside the workdir

    config.checkpoint = checkpoint = ml_collections.ConfigDict()
    checkpoint.every = 200
    checkpoint.keep = 2
    # A finished run (completed or diverged) keeps only its final checkpoint, which is all that
    # --extend resumes from and `nonfinite` replays from; True keeps the newest `keep`, e.g. to
    # repair damaged metrics rows from before the final step (otherwise refused, naming the run).
    checkpoint.keep_finished = False
    # False: a completed run keeps no checkpoint (a smoke sweep's disk), so it cannot be
    # extended; a diverged run still keeps the step `nonfinite` replays from.
    checkpoint.keep_final = True

    config.wandb = wandb = ml_collections.ConfigDict()
    wandb.mode = "auto"  # auto | online | offline | disabled
    wandb.project = "scale_ablation"
    wandb.entity = ""
    wandb.group = ""
    wandb.job_type = "train"
    wandb.tags = ()
    wandb.init_timeout = 30.0  # seconds; an unanswered init turns the process's runs offline

    if arg == "quick":
        model.d_model, model.num_layers, model.num_heads, model.head_dim = 64, 2, 2, 32
        data.seq_len, data.val_batches = 64, 2
        data.test_bytes = 4 * 1024  # a smoke check's test split: tests train many quick runs
        train.steps, train.batch_size, train.warmup_steps = 60, 8, 10
        train.log_every, train.eval_every, train.diag_every = 10, 30, 30
        checkpoint.every = 30
    elif arg == "cpu":
        # 600 steps × 16 × 128 bytes (1.2M, a quarter of a pass over the plays): ~45 s on 2
        # cores. 400 steps left one head of 128 only 0.33 bits per byte below the bigram
        # baseline at LR 3e-3, too close to the 0.3 a study must clear to say anything.
        train.steps, train.warmup_steps = 600, 50
        train.log_every, train.eval_every, train.diag_every = 10, 100, 50
        checkpoint.every = 200
    elif arg == "gpu":
        model.d_model, model.num_layers, model.num_heads, model.head_dim = 512, 8, 8, 64
        model.attention_impl = "fused"
        # WikiText-103 (raw), streamed: 546.5 MB of Wikipedia articles in its train split
        # (the dataset card's num_bytes; 1.80M lines) and its own 1.16 MB validation split.
        # 5000 steps × 64 × 512 bytes = 164M, 0.30 passes; the d_k sweep's 3000 steps read
        # 98M, 0.18 passes. The 4.8 MB of plays would repeat 34 and 20 times (the final loss
        # would then measure memorisation). Read from a local copy in the hub's layout
        # (LOCAL_WIKITEXT; README, "Data on a machine without network"), so that a device
        # without network runs it; --config.data.source=hf:Salesforce/wikitext:wikitext-103-raw-v1
        # streams it from the hub instead (the [hf] extra either way).
        data.source = f"hf:{LOCAL_WIKITEXT}:wikitext-103-raw-v1"
        data.seq_len = 512
        train.steps, train.batch_size, train.dtype = 5000, 64, "bfloat16"
        train.eval_every, train.diag_every, checkpoint.every = 500, 250, 1000
        train.steps_per_call = 8  # the host's ~6 ms to launch a step program, paid per 8 steps
    return config
