r"""Length generalisation: train at n, evaluate at 2n and 4n (Scalable-Softmax, Nakanishi 2025).

  python -m scale_ablation.sweep --config=experiments/length_generalization.py:quick \
      --workdir=runs/length_quick

With a fixed scale, attention over more keys gets flatter (the softmax denominator grows with n);
`log_length` multiplies the logits by s·ln(n) to keep its sharpness. Rotary positions, so that
longer sequences need no new position embeddings. Each run logs `val/loss@{2n}` and
`val/loss@{4n}` next to `val/loss` at the training length n.
"""

from experiments import base


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "gpu"))
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("length_generalization",)
    config.model.positions = "rotary"
    n = config.data.seq_len
    config.train.eval_seq_lens = (2 * n, 4 * n)
    if arg == "quick":
        config.train.steps = 200
    return config


def sweep(arg: str | None = None) -> list[dict]:
    head_dims = (32,) if arg == "quick" else (64, 256)
    seeds = (0,) if arg == "quick" else (0, 1)
    return [
        {"policy": policy, "model.head_dim": d, "train.seed": seed}
        for policy in ("inv_sqrt_dk", "log_length", "log_length:0.5", "qk_layernorm")
        for d in head_dims
        for seed in seeds
    ]
