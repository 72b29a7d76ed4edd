r"""Multi-query associative recall accuracy per policy × d_k (Arora et al. 2023, "Zoology").

  python -m scale_ablation.sweep --config=experiments/mqar.py:quick --workdir=runs/mqar_quick

Recall needs attention that can focus sharply on one key, which is what the scale controls.
`val/accuracy` in each run's metrics is the recall accuracy on the answer positions.
"""

from experiments import base

POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "const:0.1", "learned", "qk_layernorm")


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "gpu"))
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("mqar",)
    config.data.source = "mqar"
    config.data.seq_len = 64 if arg == "quick" else 256
    config.data.mqar_num_pairs = 8 if arg == "quick" else 32
    config.train.steps = 300 if arg == "quick" else 4000
    config.train.lr = 1e-3
    return config


def sweep(arg: str | None = None) -> list[dict]:
    head_dims = (16, 64) if arg == "quick" else (16, 64, 256)
    return [{"policy": p, "model.head_dim": d} for p in POLICIES for d in head_dims]
