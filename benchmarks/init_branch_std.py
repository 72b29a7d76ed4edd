"""Std at initialisation of the residual stream's input (token + position embedding) and of each
block's attention and MLP branch outputs, on the validation bytes, per `model.init` and head count
at d_model 256: how loudly each branch writes into the stream before any training.

    python -m benchmarks.init_branch_std
"""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import base
from scale_ablation.data import sources as data
from scale_ablation.model.build import build_model

SHAPES = ((16, 16), (4, 64), (1, 256))  # heads × head_dim at width 256


def branch_stds(init: str, heads: int, head_dim: int, tokens: jnp.ndarray) -> list[float]:
    """[embedding, block 0 attention, block 0 MLP, block 1 attention, ...] output stds."""
    config = base.get_config()
    config.model.update(d_model=256, num_heads=heads, head_dim=head_dim, init=init)
    model = build_model(config, nnx.Rngs(params=0))
    x = model.embed(tokens) + model.position_embed(jnp.arange(tokens.shape[1]))[None]  # (B, T, C)
    stds = [float(x.std())]
    for block in model.blocks:  # pre-norm blocks, as in LanguageModel
        attended, _ = block.attention(block.attention_norm(x))
        x = x + attended
        mlp = block.mlp(block.mlp_norm(x))
        x = x + mlp
        stds += [float(attended.std()), float(mlp.std())]
    return stds


def main() -> None:
    data_config = base.get_config().data
    data_config.seq_len = 64
    source = data.make_source(data_config, seed=0)
    tokens = jnp.asarray(np.concatenate([b.inputs for b in source.val_batches(8, 64, 4)]))
    print("init    heads×d_k  embedding  attn0  mlp0  attn1  mlp1")
    for init in ("fan_in", "xavier", "gpt2"):
        for heads, head_dim in SHAPES:
            stds = branch_stds(init, heads, head_dim, tokens)
            print(f"{init:7s} {heads:>3d}×{head_dim:<5d} " + "  ".join(f"{s:.3f}" for s in stds))


if __name__ == "__main__":
    main()
