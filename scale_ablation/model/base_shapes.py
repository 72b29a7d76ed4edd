"""μP's base shapes: each parameter's shape against its base model's (`mup.set_base_shapes`).

Both models are traced abstractly (`nnx.eval_shape`: nothing is allocated), so the rules need no
list of layer names: a parameter whose two dims both differ from the base model's is
matrix-like, a kernel whose fan-in alone differs is an output weight, whatever module made it
(`parametrization.role`). The one name known here is the readout's: it is mup's MuReadout
itself (its 1/m_d is in lm.py's forward pass), so nothing is folded into its weight.
"""

from __future__ import annotations

import functools

import jax
from flax import nnx

from scale_ablation.model import parametrization, umup
from scale_ablation.model.lm import LanguageModel
from scale_ablation.model.spec import ModelConfig

READOUT = "['readout']"  # LanguageModel.readout's keystr path (then `.value`)


def param_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """keystr path -> shape of every trained parameter (the `nnx.Param` state of the model)."""
    # LanguageModel, not build.build_model: that one rescales by `init_multipliers`, built on this.
    abstract = nnx.eval_shape(lambda: LanguageModel(model, rngs=nnx.Rngs(params=0)))
    params = nnx.split(abstract, nnx.Param, ...)[1]
    return {jax.tree_util.keystr(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


def _multipliers(model: ModelConfig, rule) -> tuple[tuple[str, float], ...]:
    """(keystr path, rule(shape, base shape)) of each parameter where it is not 1, the readout
    left out; none under sp."""
    if not parametrization.is_mup(model):
        return ()
    shapes, base = param_shapes(model), param_shapes(parametrization.base_model(model))
    found = ((path, rule(shape, base[path])) for path, shape in shapes.items()
             if not path.startswith(READOUT))
    return tuple((path, m) for path, m in found if m != 1.0)


@functools.cache
def lr_multipliers(model: ModelConfig) -> tuple[tuple[str, float], ...]:
    """(keystr path, Adam LR multiplier) of each parameter whose multiplier is not 1: none under
    sp; under μP the matrix-like ones and the output weights, base fan_in / fan_in; under u-μP
    its own absolute rules (`umup.lr_multipliers`, no base model)."""
    if umup.is_on(model):
        return umup.lr_multipliers(model, param_shapes(model))
    return _multipliers(model, parametrization.lr_multiplier)


@functools.cache
def init_multipliers(model: ModelConfig) -> tuple[tuple[str, float], ...]:
    """(keystr path, init std multiplier) of each parameter whose multiplier is not 1: under μP
    the output weights other than the readout (the attention's output projection when the head
    dim grows), (base fan_in / fan_in)^½."""
    return _multipliers(model, parametrization.init_multiplier)


def rescale_init(lm: nnx.Module, model: ModelConfig) -> None:
    """Multiply `lm`'s freshly initialised parameters by `init_multipliers` in place (mup's
    `set_base_shapes(rescale_params=True)`, which rescales its MuReadouts after construction)."""
    factors = dict(init_multipliers(model))
    if not factors:
        return

    def rescale(path, leaf):
        factor = factors.get(jax.tree_util.keystr(path))
        return leaf if factor is None else leaf * factor

    nnx.update(lm, jax.tree_util.tree_map_with_path(rescale, nnx.state(lm, nnx.Param)))
