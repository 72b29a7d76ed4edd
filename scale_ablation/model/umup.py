"""u-μP, the unit-scaled Maximal Update Parametrisation (`model.parametrization=umup`, off unless
set): Blake et al. 2024, "u-μP: The Unit-Scaled Maximal Update Parametrization", as Graphcore's
`unit-scaling` package (0.3.5; `unit_scaling.functional`, `.optim`, `.core.functional`) applies
it to a pre-norm Transformer. Every rule is absolute: unlike μP (parametrization.py), u-μP takes
no base model, so `model.base_d_model` and `model.base_head_dim` change nothing under it, and at
no width is u-μP SP. The forward pass (lm.py, attention.py):

- linear layers (q, k, v, the attention output, both MLP matrices): weights N(0, 1) and the
  output (x·W + b)·fan_in^-½ (`functional.linear`): the `fan_in` init's 1/√fan_in moved from the
  weight into the forward pass, which is what makes Adam's step act on a unit-scale weight;
- embeddings (tokens; learned positions): N(0, 1); a learned position embedding joins the token
  embedding by the unit-scaled add (a + b)·2^-½ (`functional.add`);
- attention: the policy's logit scale (u-μP's own is mult/d_head, the package's default mult 1:
  the policy `inv_dk`), and its output × 1/σ(mult, d_k, T) (`functional.scaled_dot_product_
  attention`'s empirical model of a causal attention's output std; `attention_output_multiplier`);
  any plain-number policy s is u-μP's attention at mult = s·d_k;
- GELU: the MLP's own (tanh) GELU × the package's output scale of GELU at mult 1
  (`functional.gelu`, `GELU_SCALE`);
- residual branches: the i-th of the 2L branches (attention, MLP, attention, ...) joins the
  stream as (x + τ_i·f(LN(x)))/√(1 + τ_i²) with τ_i = 1/√(L + i) (`residual_split`/`residual_add`
  with `transformer_residual_scaling_rule()`'s default ratios): the embedding, the attention and
  the MLP branches end up with a third of the stream's variance each;
- readout: untied from the embedding, N(0, 1), its output x·W/d_model (`functional.
  linear_readout`: 1/fan_in, not 1/√fan_in).

The optimiser (`lr_multipliers`, applied to Adam's step by optim.py as μP's are): a weight's LR ×
fan_in^-½ (an embedding's fan-in is its width d_model, as the package counts it), biases and
norm gains × 1, the readout × 1, and every parameter inside a residual block × L^-½ as well
(`optim.lr_scale_func_adam`, depth from `DepthModuleList`). μP instead divides the LR of a
matrix by fan_in/base_fan_in and leaves the embedding's and the blocks' alone.

What differs from the package, by design: (1) gradients are JAX's true gradients of this forward
pass; the package's backward passes carry other scales (`scale_bwd`), which tests/test_umup.py
measures to be one positive factor per parameter tensor, to which Adam's update is blind but for
ε (1e-8). The package's backward keeps gradients near unit scale, ours do not: at init on
umup_transfer's cpu model the smallest per-tensor gradient RMS (the last block's q/k kernels)
is 1.1e-5 at width 64 and 5.6e-7 at 256, so ε is ~2% of Adam's denominator there and, at
that rate (÷19 per ×4 in width), would equal it near width 2048; (2) weight decay stays this
codebase's (lr·wd·p a step, the multiplier on Adam's step alone, on matrices and embeddings
only): the package's default `independent_weight_decay` decays every parameter, norms and
biases too, by wd·p alike, the same per-parameter law with our lr·wd as its wd. At a
sequence of one token the attention is its value row, unit-scaled already: multiplier 1 (the
package's model is undefined there, log 1 = 0).

Configurations the package's rules do not cover are refused (`check`): post-norm, an init other
than `fan_in` or a q/k gain, CompleteP's depth_alpha (u-μP has its own depth rule), μP's
zero-initialised readout, a q/k width apart from the value width, attention dropout, and policies
that are not a plain number (learned, QK-norm, soft-caps, sinks, ...).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from scale_ablation.model import depth, policies

if TYPE_CHECKING:
    from scale_ablation.model.spec import ModelConfig

NAME = "umup"
POLICY = "inv_dk"  # u-μP's own attention scale: mult/d_head at the package's default mult, 1
EMBEDDING_SUM = 2 ** -0.5  # the unit-scaled add of token and position embeddings
# unit_scaling.functional.gelu at mult 1: a log-interpolation, weight 0.8, between the std ratios
# 2 (its lower limit) and √(2/(1 - 1/π)) (its upper).
GELU_SCALE = math.exp(0.8 * math.log(math.sqrt(2 / (1 - 1 / math.pi))) + 0.2 * math.log(2))


def is_on(model: ModelConfig) -> bool:
    return model.parametrization == NAME


def unit_init() -> jax.nn.initializers.Initializer:
    """Every u-μP weight's init, N(0, 1)."""
    return jax.nn.initializers.normal(1.0)


class UnitScaledLinear(nnx.Linear):
    """A linear layer whose output (x·W + b) is × fan_in^-½, W ~ N(0, 1)."""

    def __init__(self, fan_in: int, fan_out: int, *, use_bias: bool, dtype, rngs: nnx.Rngs):
        super().__init__(fan_in, fan_out, use_bias=use_bias, kernel_init=unit_init(),
                         dtype=dtype, rngs=rngs)
        self.multiplier = fan_in ** -0.5  # static: part of the graphdef

    def __call__(self, x: jax.Array) -> jax.Array:
        return super().__call__(x) * self.multiplier


def linear(model: ModelConfig, fan_in: int, fan_out: int, kernel_init, *, use_bias: bool = True,
           rngs: nnx.Rngs) -> nnx.Linear:
    """The model's linear layer: unit-scaled under u-μP, else nnx.Linear with `kernel_init`."""
    if is_on(model):
        return UnitScaledLinear(fan_in, fan_out, use_bias=use_bias, dtype=model.compute_dtype,
                                rngs=rngs)
    return nnx.Linear(fan_in, fan_out, use_bias=use_bias, kernel_init=kernel_init,
                      dtype=model.compute_dtype, rngs=rngs)


def forward_multiplier(layer: nnx.Linear) -> float:
    """What `layer` multiplies x·W + b by: fan_in^-½ if unit-scaled, else 1."""
    return layer.multiplier if isinstance(layer, UnitScaledLinear) else 1.0


def attention_output_multiplier(scale, d_k: int, seq_len: int):
    """1/σ of causal attention's output at logit scale `scale` (a float or a traced array) over
    `seq_len` keys. The package's model of σ log-interpolates between √(ln T / T) (flat weights)
    and 1 (one-hot weights) with weight α = 1/(1 + 4·d_k/mult²), mult = scale·d_k: the larger
    the logits' variance mult²/d_k, the nearer one-hot."""
    if seq_len < 2:
        return 1.0  # one key: the output is its value row
    alpha = 1.0 / (1.0 + 4.0 / (scale * scale * d_k))
    return (seq_len / math.log(seq_len)) ** ((1.0 - alpha) / 2.0)


def rescale_attention(out: jax.Array, scale: jax.Array, d_k: int) -> jax.Array:
    """Causal self-attention's output [B, T, H, D] × `attention_output_multiplier` (T keys)."""
    multiplier = attention_output_multiplier(scale, d_k, out.shape[1])
    return out * jnp.asarray(multiplier, jnp.float32).astype(out.dtype)


def residual_weights(model: ModelConfig, layer: int) -> tuple[tuple[float, float], ...]:
    """(skip, branch) multipliers of layer `layer`'s attention and MLP branches as they join
    the stream: (1/√(1 + τ²), τ/√(1 + τ²)) with τ = 1/√(L + i), i the branch's index."""
    out = []
    for index in (2 * layer, 2 * layer + 1):
        tau = (model.num_layers + index) ** -0.5
        norm = math.sqrt(1.0 + tau * tau)
        out.append((1.0 / norm, tau / norm))
    return tuple(out)


def readout_multiplier(model: ModelConfig) -> float:
    return 1.0 / model.d_model


def param_type(path: str, shape: tuple[int, ...]) -> str:
    """The package's `mup_type` of one of our parameters (keystr path): "output" (the readout),
    "weight" (a kernel or an embedding) or "bias" (biases and norm gains: one rule)."""
    if path.startswith("['readout']"):
        return "output"
    if len(shape) == 2 and ("['kernel']" in path or "['embedding']" in path):
        return "weight"
    if len(shape) <= 1:
        return "bias"
    raise ValueError(f"u-μP has no rule for the parameter {path} of shape {shape}")


def lr_multiplier(path: str, shape: tuple[int, ...], num_layers: int) -> float:
    """Adam's LR multiplier of one parameter: fan_in^-½ for a weight (a kernel's fan-in is its
    first dim, an embedding's its width), × num_layers^-½ inside a residual block."""
    kind = param_type(path, shape)
    factor = num_layers ** -0.5 if depth.in_block(path) else 1.0
    if kind == "weight":
        fan_in = shape[1] if "['embedding']" in path else shape[0]
        factor *= fan_in ** -0.5
    return factor


def lr_multipliers(model: ModelConfig, shapes: dict[str, tuple[int, ...]]
                   ) -> tuple[tuple[str, float], ...]:
    """(keystr path, multiplier) of every parameter in `shapes` (base_shapes.param_shapes)."""
    found = ((path, lr_multiplier(path, shape, model.num_layers)) for path, shape in shapes.items())
    return tuple((path, m) for path, m in found if m != 1.0)


def check(model: ModelConfig) -> str | None:
    """What u-μP does not cover in `model`, as one line naming the field, or None."""
    if not is_on(model):
        return None
    refusals = (  # (refused, what it needs and why, the value it got)
        (model.norm_position != "pre", "model.norm_position=pre (its residual rule is for "
         "pre-norm blocks)", model.norm_position),
        (model.init != "fan_in", "model.init=fan_in (its unit-scaled linear is fan_in's "
         "1/√fan_in in the forward pass)", model.init),
        (model.init_gain != 1.0, "model.init_gain=1 (its weights are N(0, 1))", model.init_gain),
        (depth.is_on(model), "model.depth_alpha off (it has its own depth rule)",
         model.depth_alpha),
        (model.readout_zero_init is not False, "model.readout_zero_init=false (its readout is "
         "N(0, 1))", model.readout_zero_init),
        (model.qk_dim not in (0, model.head_dim), "model.qk_dim=0 (its attention has one head "
         "width)", model.qk_dim),
        (model.attention_dropout != 0, "model.attention_dropout=0 (its output rescaling "
         "assumes none)", model.attention_dropout),
    )
    for refused, needs, value in refusals:
        if refused:
            return f"model.parametrization={NAME} needs {needs}, got {value!r}"
    return None


_PLAIN = policies.scalar(lambda head_dim: 1.0)  # equality ignores the number: any plain policy


def check_policy(model: ModelConfig, spec: str, policy: policies.ScalePolicy) -> str | None:
    """Under u-μP, a layer's policy must be a plain number: the output rescaling is a function
    of the logits' scale alone. One line naming the policy, or None."""
    if is_on(model) and policy != _PLAIN:
        return (f"model.parametrization={NAME} needs a policy that is a plain number (u-μP's "
                f"attention at mult = scale·d_k), got {spec!r}")
    return None
