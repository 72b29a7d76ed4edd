"""Weight initialisers the model's layers share: fan-in, Xavier and GPT-2's normal.

`kernel_init(model.init, gain)` is the one dispatch; the attention projections, the MLP and the
embeddings all take theirs from here.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from scale_ablation.model.spec import INITS


def xavier_normal(gain: float) -> Callable:
    """Xavier/Glorot normal with a gain: std = gain·sqrt(2 / (fan_in + fan_out))."""
    return jax.nn.initializers.variance_scaling(gain**2, "fan_avg", "normal")


GPT2_STD = 0.02  # GPT-2's std for every weight matrix and embedding (Radford et al. 2019)


def gpt2_normal(gain: float = 1.0, residual_layers: int = 0) -> Callable:
    """GPT-2's init: N(0, (gain·0.02)²), whatever the shape; a projection that writes into the
    residual stream (attention output, MLP output) of a `residual_layers`-layer model gets
    std 0.02/√(2·residual_layers), so the stream's variance at init does not grow with depth."""
    std = gain * GPT2_STD
    if residual_layers:
        std /= (2 * residual_layers) ** 0.5
    return jax.nn.initializers.normal(std)


def kernel_init(kind: str, gain: float = 1.0, *, residual_layers: int = 0) -> Callable:
    """'fan_in': std = gain/√fan_in, so unit-variance inputs give outputs of variance gain²
    whatever the output width (the article's premise that q and k entries have unit variance
    holds for every d_k). 'xavier': Xavier normal, whose variance 2/(fan_in + fan_out) shrinks
    as num_heads·head_dim grows, confounding d_k with the init variance. 'gpt2': a fixed std of
    0.02 (`gpt2_normal`); residual_layers (the layer count, for a projection that writes into the
    residual stream) matters to gpt2 only."""
    if kind == "fan_in":
        return jax.nn.initializers.variance_scaling(gain**2, "fan_in", "normal")
    if kind == "xavier":
        return xavier_normal(gain)
    if kind == "gpt2":
        return gpt2_normal(gain, residual_layers)
    raise ValueError(f"model.init must be one of {', '.join(INITS)}, got {kind!r}")
