"""The model spec: `ModelConfig`, everything that shapes the model, frozen and hashable.

Built once per run from the run config (`training.run_config.validate`) and passed down the
module tree, one name per setting from the experiment file to the attention layer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from scale_ablation.errors import ConfigError
from scale_ablation.model import policies

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
INITS = ("fan_in", "xavier", "gpt2")  # model.init: see initializers.kernel_init


def choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{field} must be one of {', '.join(allowed)}; got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything that shapes the model, under the config's names (`model.*`, plus the compute
    dtype and one policy spec per layer). Frozen and hashable: equal configs build equal
    graphdefs, which is what lets runs share compiled programs."""

    d_model: int
    num_layers: int
    num_heads: int
    head_dim: int
    layer_policies: tuple[str, ...] = ()
    mlp_ratio: int = 4
    norm: str = "layernorm"
    norm_position: str = "pre"
    positions: str = "learned"
    max_seq_len: int = 1024
    init: str = "fan_in"
    init_gain: float = 1.0
    logits_dtype: str = "float32"
    attention_dropout: float = 0.0
    attention_impl: str = "reference"
    dtype: str = "float32"
    vocab_size: int = 256

    def check(self) -> None:
        if min(self.head_dim, self.num_heads, self.d_model, self.num_layers) <= 0:
            raise ConfigError("model.head_dim, num_heads, d_model and num_layers must be "
                              f"positive, got {self.head_dim}, {self.num_heads}, {self.d_model}, "
                              f"{self.num_layers}")
        if self.positions == "rotary" and self.head_dim % 2:
            raise ConfigError(f"model.positions=rotary needs an even model.head_dim, "
                              f"got {self.head_dim}")
        choice("train.dtype", self.dtype, tuple(DTYPES))
        choice("model.logits_dtype", self.logits_dtype, ("float32", "activation"))
        choice("model.norm", self.norm, ("layernorm", "rmsnorm"))
        choice("model.norm_position", self.norm_position, ("pre", "post"))
        choice("model.positions", self.positions, ("learned", "rotary"))
        choice("model.init", self.init, INITS)
        choice("model.attention_impl", self.attention_impl, ("reference", "fused"))
        if len(self.layer_policies) != self.num_layers:
            raise ConfigError(f"{len(self.layer_policies)} layer policies for "
                              f"model.num_layers={self.num_layers}")
        for spec in self.layer_policies:
            policy = policies.get(spec)  # ValueError naming the policy
            try:
                scale = policy.base_scale(self.head_dim)
            except (ArithmeticError, ValueError) as error:  # e.g. 1/ln(d_k) at d_k = 1
                raise ConfigError(f"policy {spec!r} has no scale at model.head_dim="
                                  f"{self.head_dim}: {error}") from None
            if scale is not None and not math.isfinite(float(scale)):
                raise ConfigError(f"policy {spec!r} gives scale {scale} at model.head_dim="
                                  f"{self.head_dim}")

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def attention_logits_dtype(self) -> Any:
        """float32, or None: the activations' own dtype (the article's pitfall 3)."""
        return jnp.float32 if self.logits_dtype == "float32" else None
