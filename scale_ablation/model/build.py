"""The LanguageModel a ModelConfig describes, under μP with its output weights' init rescaled:
apart from lm.py because the rescale traces the base model (base_shapes imports lm)."""

from __future__ import annotations

from flax import nnx

from scale_ablation.model import base_shapes, parametrization
from scale_ablation.model.lm import LanguageModel
from scale_ablation.model.spec import ModelConfig


def build_model(model: ModelConfig, rngs: nnx.Rngs) -> LanguageModel:
    """The LanguageModel a ModelConfig describes (`ModelConfig.from_config` has checked it);
    under μP with its output weights' init rescaled (`base_shapes.rescale_init`)."""
    lm = LanguageModel(model, rngs=rngs)
    if parametrization.is_mup(model):
        base_shapes.rescale_init(lm, model)
    return lm
