"""Depth: CompleteP's α-parametrisation (`model.depth_alpha`, off unless set).

Dey et al. 2025, "Don't be lazy: CompleteP enables compute-efficient deep transformers", Table 1
(a pre-LN transformer; its last column, α ∈ [1/2, 1]; α = 1 is what the paper calls CompleteP),
relative to a base depth `model.base_num_layers` = L_base, with m_L = L / L_base:

- residual branches: each block's attention and MLP outputs are multiplied by m_L^-α before they
  are added to the stream (lm.py), X + m_L^-α · MHA(LN(X)) and Z + m_L^-α · MLP(LN(Z));
- learning rate: every parameter inside a residual block (the table's hidden weights m_N^-1 ·
  m_L^(α-1), hidden biases and pre-LN gains/biases m_L^(α-1); here also a scale policy's own
  parameters, which the table does not have) takes AdamW's whole update × m_L^(α-1), its decoupled
  decay included: the table's λ carries no depth factor, so lr·λ does. The width part m_N^-1 of
  the hidden weights is μP's (`parametrization.py`; 1 under SP). The embeddings, the final norm
  and the readout keep the base LR;
- Adam's ε of the residual blocks' parameters (the table's "AdamW ε (residual blocks)"):
  ε_base · m_N^-1 · m_L^-α, m_N the μP width multiplier (1 under SP). μP without depth_alpha
  leaves ε as mup's MuAdamW does; the m_N^-1 enters with depth_alpha, as in the table's column.
  nanoGPT-mup's completep branch (model.py, `configure_optimizers`) scales one optimiser-wide ε
  by the same m_N^-1 · m_L^-α, so its embeddings and final norm get it too; this follows the
  table, which names the residual blocks.
- init: unchanged (the table's hidden init variance σ²·m_N^-1 is μP's; it has no depth factor).

At L = L_base every multiplier is 1 (the ε's m_N^-1 apart), so the base depth's model is the
model without depth_alpha. The rules assume pre-LN and a depth-free init: depth_alpha refuses
`model.norm_position=post` and `model.init=gpt2` (GPT-2's 1/√(2L) on the residual projections is
a depth rule of its own). tests/test_completep.py checks the multipliers read from a built model
and optimiser against the table and against the branch's formulas.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scale_ablation.model import parametrization

if TYPE_CHECKING:
    from scale_ablation.model.spec import ModelConfig

ALPHA_RANGE = (0.5, 1.0)
BLOCKS = "['blocks']"  # the keystr prefix of every parameter inside a residual block


def is_on(model: ModelConfig) -> bool:
    """Whether `model.depth_alpha` is set (None and 0 are off)."""
    return bool(model.depth_alpha)


def depth_multiplier(model: ModelConfig) -> float:
    """m_L = num_layers / base_num_layers (1 when depth_alpha is off)."""
    return model.num_layers / model.base_num_layers if is_on(model) else 1.0


def residual_multiplier(model: ModelConfig) -> float:
    """What each residual branch is multiplied by before it joins the stream: m_L^-α."""
    return depth_multiplier(model) ** -model.depth_alpha if is_on(model) else 1.0


def lr_multiplier(model: ModelConfig) -> float:
    """The residual blocks' AdamW update multiplier, m_L^(α-1) (1 at α = 1)."""
    return depth_multiplier(model) ** (model.depth_alpha - 1) if is_on(model) else 1.0


def eps_multiplier(model: ModelConfig) -> float:
    """The residual blocks' Adam ε over the base ε: m_N^-1 · m_L^-α."""
    if not is_on(model):
        return 1.0
    return residual_multiplier(model) / parametrization.width_multiplier(model)


def in_block(path: str) -> bool:
    """Whether a parameter's keystr path is inside a residual block."""
    return path.startswith(BLOCKS)


def check(model: ModelConfig) -> str | None:
    """What is wrong with `model`'s depth fields, as one line naming the field, or None."""
    alpha, base = model.depth_alpha, model.base_num_layers
    if not isinstance(base, int) or isinstance(base, bool) or base < 1:
        return (f"model.base_num_layers must be a positive integer (CompleteP's base depth "
                f"L_base), got {base!r}")
    if not is_on(model):
        return None
    low, high = ALPHA_RANGE
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (
            math.isfinite(alpha) and low <= alpha <= high):
        return (f"model.depth_alpha must be 0 or None (off) or a number in [{low}, {high}] "
                f"(CompleteP's α: residual branches × (L/L_base)^-α), got {alpha!r}")
    if model.norm_position != "pre":
        return ("model.depth_alpha needs model.norm_position=pre (CompleteP's rules are for a "
                f"pre-LN transformer), got {model.norm_position!r}")
    if model.init == "gpt2":
        return ("model.depth_alpha needs a depth-free init (fan_in or xavier): gpt2's "
                "1/√(2L) residual init is a depth rule of its own")
    return None
