r"""draft"""

from experiments import base

POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "const:0.1", "learned", "qk_layernorm")


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu", "gpu"))
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("mqar",)
    config.data.source = "mqar"
    config.data.mqar_vocab_size = 8192
    config.data.mqar_power_a = 0.01
    config.data.seq_len = 64
    config.data.mqar_num_pairs = 4
    config.model.num_heads, config.model.head_dim = 1, 128
    config.train.batch_size = 64
    config.train.steps = 1000
    return config


def sweep(arg: str | None = None) -> list[dict]:
    return [{"policy": p} for p in POLICIES]
