"""μP's base shapes: each parameter's shape against its base model's (`mup.set_base_shapes`).

Both models are traced abstractly (`nnx.eval_shape`: nothing is allocated), so the rule needs no
list of layer names: a parameter whose two dims both differ from the base model's is
matrix-like, whatever module made it (`parametrization.matrix_lr_multiplier`).
"""

from __future__ import annotations

import functools

import jax
from flax import nnx

from scale_ablation.model import parametrization
from scale_ablation.model.lm import build_model
from scale_ablation.model.spec import ModelConfig


def param_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """keystr path -> shape of every trained parameter (the `nnx.Param` state of the model)."""
    abstract = nnx.eval_shape(lambda: build_model(model, nnx.Rngs(params=0)))
    params = nnx.split(abstract, nnx.Param, ...)[1]
    return {jax.tree_util.keystr(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


@functools.cache
def lr_multipliers(model: ModelConfig) -> tuple[tuple[str, float], ...]:
    """(keystr path, Adam LR multiplier) of each parameter whose multiplier is not 1: none under
    sp; under μP the matrix-like ones, base fan_in / fan_in."""
    if not parametrization.is_mup(model):
        return ()
    shapes, base = param_shapes(model), param_shapes(parametrization.base_model(model))
    found = ((path, parametrization.matrix_lr_multiplier(shape, base[path]))
             for path, shape in shapes.items())
    return tuple((path, m) for path, m in found if m != 1.0)
