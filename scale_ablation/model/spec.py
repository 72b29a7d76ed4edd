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
from scale_ablation.model import depth, parametrization, policies, umup

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
    # q/k per-head width (d_k); 0 = head_dim. head_dim stays the value/output width per head.
    qk_dim: int = 0
    # The precision switches apart ("float32" | "activation"); "" = as `logits_dtype`, the one
    # switch of configs before them, which therefore still means both.
    qk_product_dtype: str = ""
    softmax_dtype: str = ""
    attention_impl: str = "reference"
    dtype: str = "float32"
    # The residual stream's dtype: "" = the compute dtype (`dtype`); "float32" keeps the stream,
    # the norms and the additions in float32 while the blocks' matmuls run in `dtype` (lm.py).
    residual_dtype: str = ""
    vocab_size: int = 256
    # μP (model/parametrization.py): sp | mup | umup (u-μP: model/umup.py), the base shape μP is
    # relative to (0: the model's own) and the readout's zero-initialised, untied option.
    parametrization: str = "sp"
    base_d_model: int = 0
    base_head_dim: int = 0
    readout_zero_init: bool = False
    # CompleteP (model/depth.py): α of the residual branches' (L/L_base)^-α, 0 or None = off,
    # and the base depth L_base it is relative to.
    depth_alpha: float | None = 0.0
    base_num_layers: int = 1

    def check(self) -> None:
        if min(self.head_dim, self.num_heads, self.d_model, self.num_layers) <= 0:
            raise ConfigError("model.head_dim, num_heads, d_model and num_layers must be "
                              f"positive, got {self.head_dim}, {self.num_heads}, {self.d_model}, "
                              f"{self.num_layers}")
        if not isinstance(self.qk_dim, int) or self.qk_dim < 0:
            raise ConfigError(f"model.qk_dim must be 0 (= model.head_dim) or a positive width, "
                              f"got {self.qk_dim!r}")
        if self.positions == "rotary" and self.qk_width % 2:
            raise ConfigError(f"model.positions=rotary needs an even q/k width (model.qk_dim, "
                              f"else model.head_dim), got {self.qk_width}")
        choice("train.dtype", self.dtype, tuple(DTYPES))
        choice("model.logits_dtype", self.logits_dtype, ("float32", "activation"))
        choice("model.residual_dtype", self.residual_dtype, ("", "float32"))
        for field in ("qk_product_dtype", "softmax_dtype"):
            choice(f"model.{field}", getattr(self, field), ("", "float32", "activation"))
        choice("model.norm", self.norm, ("layernorm", "rmsnorm"))
        choice("model.norm_position", self.norm_position, ("pre", "post"))
        choice("model.positions", self.positions, ("learned", "rotary"))
        choice("model.init", self.init, INITS)
        choice("model.attention_impl", self.attention_impl,
               ("reference", "fused", "blocked", "auto"))
        for problem in (parametrization.check(self), depth.check(self), umup.check(self)):
            if problem is not None:
                raise ConfigError(problem)
        if len(self.layer_policies) != self.num_layers:
            raise ConfigError(f"{len(self.layer_policies)} layer policies for "
                              f"model.num_layers={self.num_layers}")
        for layer, spec in enumerate(self.layer_policies):
            policy = policies.get(spec)  # ValueError naming the policy
            if (problem := umup.check_policy(self, spec, policy)) is not None:
                raise ConfigError(problem)
            try:
                scale = self.base_scale(policy, layer)
            except (ArithmeticError, ValueError) as error:  # e.g. 1/ln(d_k) at d_k = 1
                raise ConfigError(f"policy {spec!r} has no scale at d_k={self.qk_width}: "
                                  f"{error}") from None
            if scale is not None and not math.isfinite(float(scale)):
                raise ConfigError(f"policy {spec!r} gives scale {scale} at d_k={self.qk_width}")
            reason = policy.fused_unsupported()
            if self.attention_impl == "fused" and reason:
                raise ConfigError(f"model.attention_impl=fused cannot compute policy {spec!r}: "
                                  f"{reason}; use model.attention_impl=reference")

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def stream_dtype(self) -> Any:
        """The residual stream's dtype: `residual_dtype`, or the compute dtype when it is ""."""
        return DTYPES[self.residual_dtype] if self.residual_dtype else self.compute_dtype

    @property
    def attention_logits_dtype(self) -> Any:
        """float32, or None: the activations' own dtype (the article's pitfall 3)."""
        return jnp.float32 if self.logits_dtype == "float32" else None

    @property
    def qk_width(self) -> int:
        """d_k: the q/k width per head (`qk_dim`, or `head_dim` when it is 0)."""
        return self.qk_dim or self.head_dim

    @property
    def attention_precision(self) -> dict[str, Any]:
        """`attention.attend`'s two precision keywords: float32, or None for the activations'
        dtype; each switch left "" follows `logits_dtype`."""
        def dtype(switch: str) -> Any:
            return jnp.float32 if (switch or self.logits_dtype) == "float32" else None

        return {"qk_product_dtype": dtype(self.qk_product_dtype),
                "softmax_dtype": dtype(self.softmax_dtype)}

    def base_scale(self, policy: policies.ScalePolicy, layer: int) -> float:
        """`policy`'s plain number in layer `layer` of this model (d_k = `qk_width`)."""
        return policy.base_scale(self.qk_width, d_model=self.d_model, num_heads=self.num_heads,
                                 layer=layer)

    def base_scales(self) -> tuple[float, ...]:
        """Each layer's plain number, in layer order."""
        return tuple(self.base_scale(policies.get(spec), layer)
                     for layer, spec in enumerate(self.layer_policies))
