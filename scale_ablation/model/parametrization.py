"""Parametrisations: how init, output and learning rates follow the width (`model.parametrization`).

`sp` (standard): what the model has always done; nothing here changes it.

`umup`: the unit-scaled μP of the unit-scaling package, with rules of its own and no base model
(`scale_ablation.model.umup`); nothing below applies to it.

`mup`: the Maximal Update Parametrisation for Adam as the `mup` package (microsoft/mup, Yang et
al. 2022, "Tensor Programs V") defines it, relative to a base model (`model.base_d_model`,
`model.base_head_dim`; 0: the model's own). At the base shape μP *is* SP; away from it, with
m = fan_in / base fan_in per parameter (`mup.infshape`: a dim is infinite when it differs from
the base model's), each parameter falls in one of mup's classes (`role`):

- matrix-like (two infinite dims: the attention and MLP kernels when d_model grows): Adam's step
  × 1/m (mup's `MuAdamW`: group lr /= m, weight_decay *= m, so the decoupled decay lr·wd·p is
  unchanged); init std 1/√fan_in, which the `fan_in` init already is (`mup.init.normal_` scales
  the base std by m^-1/2). Other inits have other width laws: μP here takes `fan_in` only.
- vector-like (one infinite dim, not a kernel's fan-in alone: embeddings, norm gains, biases,
  and the q/k/v kernels when only the head dim grows): LR and init std unchanged from the base
  model. The token embedding's std is therefore 1/√base_d_model, not the SP 1/√d_model.
- output weights (a kernel whose fan-in alone is infinite; mup asserts that such a layer is a
  `MuReadout`): the readout (tied to the embedding, mup's `MuSharedReadout`, or an untied matrix
  under `model.readout_zero_init`, mup's `MuReadout(readout_zero_init=True)`) multiplies its
  input by 1/m_d with m_d = d_model / base_d_model. Any other output weight (the attention's
  output projection when the head dim grows at a fixed d_model) has MuReadout folded into the
  weight, since a forward multiplier would change the layer: init std × m^-1/2 (1/m of the base
  std, as MuReadout's base-std weight times its 1/m) and Adam's step × 1/m with the decay
  unchanged (MuReadout's unchanged lr on a weight that acts × 1/m); the same function and
  updates up to Adam's ε.
- attention: the scale policy stays a free axis. μP's own is `mup_inv_dk:B`, attn_mult/d_k with
  attn_mult = √B, so that it equals 1/√d_k at the base head dim B (mup's 8/d_k at d_k = 64).

The head dim as μP's width (heads and d_model fixed): `base_d_model` = d_model (or 0) and
`base_head_dim` = B ≠ `head_dim` grows q, k and v per head together. q/k/v are then vector-like
(their fan-in is d_model) and the output projection an output weight: its init and LR are the
only multipliers, beside the policy `mup_inv_dk:B`. Growing q/k alone (`model.qk_dim`, the value
width fixed) leaves every parameter vector-like or finite, so μP there is SP with the policy
`mup_inv_dk:B` (B: the base q/k width); no base q/k width field is needed.

`base_shapes` applies the rules from the two models' parameter shapes, as `mup.set_base_shapes`
does; tests/test_mup.py (width) and tests/test_mup_head_dim.py (head dim) check them against the
mup package.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scale_ablation.model import policies

if TYPE_CHECKING:
    from scale_ablation.model.spec import ModelConfig

PARAMETRIZATIONS = ("sp", "mup", "umup")


def is_mup(model: ModelConfig) -> bool:
    return model.parametrization == "mup"


def base_model(model: ModelConfig) -> ModelConfig:
    """The base model of `model`'s width: `base_d_model` and `base_head_dim` in place of its own
    (0 keeps its own), everything else equal."""
    import dataclasses  # local: the only use

    return dataclasses.replace(model, d_model=model.base_d_model or model.d_model,
                               head_dim=model.base_head_dim or model.head_dim)


def width_multiplier(model: ModelConfig) -> float:
    """m_d = d_model / base_d_model (1 under sp, or with no base width)."""
    if not is_mup(model) or not model.base_d_model:
        return 1.0
    return model.d_model / model.base_d_model


def readout_multiplier(model: ModelConfig) -> float:
    """What the readout's input is multiplied by: 1/m_d under μP (mup's MuReadout), else 1."""
    return 1.0 / width_multiplier(model)


def embedding_variance_scale(model: ModelConfig) -> float:
    """The token embedding's variance over nnx's default 1/d_model: d_model/base_d_model under
    μP, so that its std is the base model's 1/√base_d_model at every width (vector-like)."""
    return width_multiplier(model)


def role(shape: tuple[int, ...], base_shape: tuple[int, ...]) -> str:
    """mup's class of one parameter of a flax model (kernels are [fan_in, fan_out]) against its
    base shape: "finite" (no dim differs), "vector", "output" (a 2-D kernel whose fan-in alone
    differs) or "matrix" (two dims differ)."""
    if len(shape) != len(base_shape):
        raise ValueError(f"shape {shape} has another rank than its base shape {base_shape}")
    infinite = [axis for axis, (n, b) in enumerate(zip(shape, base_shape, strict=True)) if n != b]
    if len(infinite) > 2:
        raise ValueError(f"shape {shape} differs from its base {base_shape} in more than two dims")
    if len(infinite) == 2:
        return "matrix"
    if infinite == [0] and len(shape) == 2:
        return "output"
    return "vector" if infinite else "finite"


def lr_multiplier(shape: tuple[int, ...], base_shape: tuple[int, ...]) -> float:
    """Adam's-step multiplier of a matrix-like or (folded) output weight: base fan_in / fan_in;
    else 1. The readout, whose 1/m_d is in its forward pass, is not passed here."""
    if role(shape, base_shape) in ("matrix", "output"):
        return base_shape[0] / shape[0]
    return 1.0


def init_multiplier(shape: tuple[int, ...], base_shape: tuple[int, ...]) -> float:
    """What a folded output weight's `fan_in` init is multiplied by: (base fan_in / fan_in)^½,
    for an std of √base_fan_in / fan_in (mup's MuReadout: the base std, × 1/m in the forward
    pass); else 1."""
    if role(shape, base_shape) == "output":
        return math.sqrt(base_shape[0] / shape[0])
    return 1.0


def check(model: ModelConfig) -> str | None:
    """What is wrong with `model`'s parametrisation fields, as one line naming the field, or
    None."""
    if model.parametrization not in PARAMETRIZATIONS:
        return (f"model.parametrization must be one of {', '.join(PARAMETRIZATIONS)}; "
                f"got {model.parametrization!r}")
    for name in ("base_d_model", "base_head_dim"):
        value = getattr(model, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"model.{name} must be a non-negative integer (0: the model's own), got {value!r}"
    if not isinstance(model.readout_zero_init, bool):
        return f"model.readout_zero_init must be true or false, got {model.readout_zero_init!r}"
    if is_mup(model) and model.init != "fan_in":
        return (f"model.parametrization=mup needs model.init=fan_in (its 1/√fan_in is μP's hidden "
                f"init at every width), got {model.init!r}")
    return None


@policies.register("mup_inv_dk")
def mup_inv_dk(arg: str | None) -> policies.ScalePolicy:
    """μP's attention scale attn_mult/d_k with attn_mult = √B: 1/√d_k at the base head dim B
    (the argument, default 64: mup's 8/d_k), 1/d_k's width law away from it."""
    base = policies.parse_number("mup_inv_dk", arg, default=64.0, expects="a base head dim B")
    attn_mult = math.sqrt(base)
    return policies.scalar(lambda head_dim: attn_mult / head_dim)
