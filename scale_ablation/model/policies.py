"""Scale policies: what multiplies the raw attention logits q·k before the softmax.

A policy is a small bundle of pure functions (see `ScalePolicy`). It may transform q and k
(QK-norm) or the raw logits (the article's pitfall 2), and it returns a multiplier per head and
per query. It never touches V and always acts before the softmax, per head.

Add a policy in one function:

    @policies.register("half_sqrt")
    def half_sqrt(arg: str | None) -> policies.ScalePolicy:
        return policies.scalar(lambda head_dim: 0.5 / head_dim**0.5)

A name can be registered once (a second `register` of it raises ValueError naming both modules).
Which module registers which built-in name: `scale_ablation/model/__init__.py` lists them all
(`registered_by(name)` says it for any name, a plugin's included).
Policies outside this package reach the command line with `--imports=my_policy.py`
(`scale_ablation.model.plugins`), or, from an installed package, with no flag through the entry-point
group `scale_ablation.model.policies` (`ENTRY_POINT_GROUP`):

    [project.entry-points."scale_ablation.policies"]
    my_policies = "my_package.policies"   # a module whose import registers its policies

Policies whose scale is a plain number are built with `scalar`: that number is handed to the
attention as a traced array (`base_scale`), so every scalar policy compiles to the same program
and a batch of scale values can be vmapped.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.metadata
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Params = Any  # a pytree of arrays
PolicyFactory = Callable[[str | None], "ScalePolicy"]


@dataclasses.dataclass(frozen=True)
class ScaleContext:
    """What a policy may look at when it computes its multiplier."""

    head_dim: int  # d_k: the q/k per-head width (`model.qk_dim`, else `model.head_dim`)
    base_scale: jax.Array  # scalar, traced: the policy's plain number (`ScalePolicy.base_scale`)
    num_keys: jax.Array  # [q_len] float32: keys each query attends to (causal: position + 1)
    positions: jax.Array | None = None  # [q_len] float32: each query's position, from 0


@dataclasses.dataclass(frozen=True)
class Dims:
    """What a policy's plain number may depend on besides d_k (`ScalePolicy.base_scale`).

    Without the model (a bare `attend` call) the head width d_model / num_heads is taken as d_k,
    which it is unless `model.qk_dim` sets q/k apart, and the layer as the first (index 0).
    """

    head_dim: int  # d_k
    d_model: int | None = None
    num_heads: int | None = None
    layer: int = 0  # the layer's index, from 0

    @property
    def head_width(self) -> float:
        """d_model / num_heads (Gemma 2's `query_pre_attn_scalar`), or d_k without a model."""
        if self.d_model is None or self.num_heads is None:
            return float(self.head_dim)
        return self.d_model / self.num_heads


def _identity_qk(params: Params, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    return q, k


def _no_params(rng: jax.Array, *, num_heads: int, head_dim: int, base_scale: float) -> Params:
    return {}


def _use_base_scale(params: Params, ctx: ScaleContext) -> jax.Array:
    return ctx.base_scale


def softmax_weights(params: Params, logits: jax.Array, mask: jax.Array | None,
                    seq_len: int) -> jax.Array:
    """softmax over the keys a query may see: the attention every policy uses unless it sets
    `ScalePolicy.weights`. logits: [B, H, Tq, Tk]; mask: [Tq, Tk] bool (True = visible)."""
    masked = logits if mask is None else jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(masked, axis=-1)


@dataclasses.dataclass(frozen=True)
class ScalePolicy:
    """A scale policy as pure functions.

    Only the functions take part in equality and hashing: two policies that compute the same way
    (every `scalar` policy) compare equal, so jit reuses one compiled program for all of them and
    their differing numbers travel as traced `base_scale` arrays.
    """

    # head_dim -> the policy's plain number (for learned policies: the value at initialisation).
    base_scale_fn: Callable[[int], float] = dataclasses.field(compare=False)
    # (params, ctx) -> multiplier broadcastable to [q_len, heads].
    scale: Callable[[Params, ScaleContext], jax.Array] = _use_base_scale
    # (rng, *, num_heads, head_dim, base_scale) -> params pytree ({} for fixed policies).
    init_fn: Callable[..., Params] = _no_params
    # (params, q, k) -> (q, k), applied per head over head_dim before q·k. q, k: [B, T, H, D].
    transform_qk: Callable[[Params, jax.Array, jax.Array], tuple[jax.Array, jax.Array]] = (
        _identity_qk
    )
    # (logits [B, H, Tq, Tk], mask [Tq, Tk] or None) -> logits, applied before the scale.
    # Policies that set it cannot be fused (the fused kernel never exposes the raw logits).
    transform_logits: Callable[[jax.Array, jax.Array | None], jax.Array] | None = None
    # params -> {name: [heads] array}: the learned values worth logging (none for fixed policies).
    learned_values: Callable[[Params], dict[str, jax.Array]] | None = None
    spec: str = dataclasses.field(default="", compare=False)
    # Dims -> the plain number, for policies whose number depends on more than d_k (the model's
    # head width, the layer's index); when set it is used instead of `base_scale_fn`.
    base_scale_dims: Callable[[Dims], float] | None = dataclasses.field(default=None,
                                                                         compare=False)
    # logits [B, H, Tq, Tk] -> logits, elementwise, after the scale (soft-capping). Not fusable.
    transform_scaled: Callable[[jax.Array], jax.Array] | None = None
    # (params, logits [B, H, Tq, Tk], mask, seq_len) -> weights on v: a policy that replaces the
    # softmax (sigmoid attention, a sink). None: `softmax_weights`. Not fusable.
    weights: Callable[[Params, jax.Array, jax.Array | None, int], jax.Array] | None = None
    weights_sum_to_one: bool = True  # False where the weights over the real keys may not
    # QK-clip's threshold T: after each optimiser step, heads whose largest logit exceeded T have
    # their W_Q and W_K columns rescaled (`scale_ablation.model.qk_clip`). None: no clipping.
    qk_clip: float | None = None
    # The cap C of a post-scale soft-cap (`transform_scaled` = C·tanh(z / C)), for diagnostics
    # alone: the share of logits past its knee |z| > C/2 says whether it bent any. None: no cap.
    soft_cap: float | None = None

    def base_scale(self, head_dim: int, *, d_model: int | None = None,
                   num_heads: int | None = None, layer: int = 0) -> float:
        """The policy's plain number at d_k = head_dim (and the model's width, the layer)."""
        if self.base_scale_dims is not None:
            return float(self.base_scale_dims(Dims(head_dim, d_model, num_heads, layer)))
        return float(self.base_scale_fn(head_dim))

    def fused_unsupported(self) -> str | None:
        """Why `jax.nn.dot_product_attention` cannot compute this policy, or None if it can
        (its q/k transform and multiplier fold into q; nothing else reaches the kernel)."""
        if self.transform_logits is not None:
            return "it transforms the raw logits, which the fused kernel never exposes"
        if self.transform_scaled is not None:
            return "it transforms the scaled logits (soft-cap), which the fused kernel never exposes"
        if self.weights is not None:
            return "it replaces the softmax, which the fused kernel computes itself"
        if self.qk_clip is not None:
            return "QK-clip needs each head's largest logit, which the fused kernel never exposes"
        return None

    def init(self, rng: jax.Array, *, num_heads: int, head_dim: int) -> Params:
        """The policy's trainable parameters as a pytree ({} for fixed policies)."""
        return self.init_fn(
            rng, num_heads=num_heads, head_dim=head_dim, base_scale=self.base_scale(head_dim)
        )



def scalar(base_scale_fn: Callable[[int], float]) -> ScalePolicy:
    """A policy whose scale is the plain number `base_scale_fn(head_dim)`."""
    return ScalePolicy(base_scale_fn=base_scale_fn)


def scalar_of_dims(base_scale_dims: Callable[[Dims], float]) -> ScalePolicy:
    """A policy whose scale is the plain number `base_scale_dims(dims)`: like `scalar`, one
    compiled program with every other scalar policy, for numbers that depend on the model's
    head width or the layer's index as well as d_k."""
    return ScalePolicy(base_scale_fn=lambda head_dim: base_scale_dims(Dims(head_dim)),
                       base_scale_dims=base_scale_dims)


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, PolicyFactory] = {}
ENTRY_POINT_GROUP = "scale_ablation.policies"
# Built-in policies outside this module, imported on the first lookup (they import this one):
# every module that registers one, so that a lookup finds it whatever the caller imported first.
BUILTIN_MODULES = ("scale_ablation.model.policy_library", "scale_ablation.model.stabilisers",
                   "scale_ablation.model.scale_family", "scale_ablation.model.parametrization",
                   "scale_ablation.model.compose")
# `A+B` composes policies (`scale_ablation.model.compose`); a '+' inside a number (1e+3) does not.
_COMPOSITION = re.compile(r"\+(?=[A-Za-z_])")
_installed = {"loaded": False}  # entry points are imported once, on first lookup
# The `A+B` combiner, set by `compose` when the built-ins load: the registry names its built-in
# modules and imports them by name, so none of them is imported back from here.
_composer: list[Callable[[ScalePolicy, ScalePolicy], ScalePolicy]] = []


def register_composer(combine: Callable[[ScalePolicy, ScalePolicy], ScalePolicy]) -> None:
    """Install `combine(first, second)` as what `A+B` means (`compose.compose`; once)."""
    if _composer:
        raise ValueError("a policy composer is already registered")
    _composer.append(combine)


def _module_of(factory: PolicyFactory) -> str:
    # A function made by exec (a user's .py file loaded by plugins) may have __module__ None.
    return getattr(factory, "__module__", None) or "?"


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Decorator: register `factory(arg: str | None) -> ScalePolicy` under `name`."""
    if not name or ":" in name:
        raise ValueError(f"policy name {name!r} must be non-empty and contain no ':'")

    def decorate(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY:
            # Silently replacing a policy would change what every run of that name measures.
            raise ValueError(f"scale policy {name!r} is registered twice: by "
                             f"{_module_of(_REGISTRY[name])} and by {_module_of(factory)}")
        _REGISTRY[name] = factory
        return factory

    return decorate


def _load_installed() -> None:
    """Import the built-in policy modules, then those installed packages name in the
    `scale_ablation.policies` entry-point group.

    Once per process, on the first `available()` or `get()`; a module that fails to import is
    reported as a ValueError naming the entry point and its package.
    """
    if _installed["loaded"]:
        return
    _installed["loaded"] = True  # set first: a plugin may itself look policies up on import
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry_point.load()
        except Exception as error:  # whatever the plugin raises, reported as one line
            package = entry_point.dist.name if entry_point.dist else "an installed package"
            message = " ".join(str(error).split())
            raise ValueError(
                f"policy plugin {entry_point.name} = {entry_point.value} (from {package}) "
                f"does not import: {type(error).__name__}: {message}"
            ) from error


def available() -> list[str]:
    """The registered policy names, installed packages' included."""
    _load_installed()
    return sorted(_REGISTRY)


def registered_by(name: str) -> str:
    """The module whose `register` call added the policy `name` (KeyError: none did)."""
    _load_installed()
    return _module_of(_REGISTRY[name])


def get(spec: str) -> ScalePolicy:
    """A policy from a spec string `name` or `name:arg` (e.g. `const:0.1`, `inv_dk:8`), or a
    composition `A+B` of such specs (`scale_ablation.model.compose`)."""
    _load_installed()
    parts = _COMPOSITION.split(str(spec))
    if len(parts) > 1:
        policy = functools.reduce(_composer[0], [get(part) for part in parts])
        return dataclasses.replace(policy, spec=str(spec))
    name, _, arg = str(spec).partition(":")
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown scale policy {name!r}.{hint} Available: {', '.join(available())}"
        )
    policy = _REGISTRY[name](arg if arg != "" else None)
    return dataclasses.replace(policy, spec=str(spec))


def parse_number(
    name: str, arg: str | None, *, default: float | None, expects: str, positive: bool = True
) -> float:
    """Parse a policy argument, raising ValueError naming the policy and what it expects."""
    if arg is None:
        if default is None:
            raise ValueError(f"policy {name!r} needs an argument: {expects}, e.g. '{name}:0.1'")
        return default
    try:
        value = float(arg)
    except ValueError:
        raise ValueError(f"policy {name!r} got {arg!r}; it expects {expects}") from None
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"policy {name!r} got {arg!r}; it expects {expects}")
    return value


def _no_arg(name: str, arg: str | None) -> None:
    if arg is not None:
        raise ValueError(f"policy {name!r} takes no argument, got {arg!r}")


# --------------------------------------------------------------------------- fixed scales


@register("inv_sqrt_dk")
def inv_sqrt_dk(arg: str | None) -> ScalePolicy:
    """1/√d_k (Vaswani et al. 2017)."""
    _no_arg("inv_sqrt_dk", arg)
    return scalar(lambda head_dim: 1.0 / math.sqrt(head_dim))


@register("none")
def no_scale(arg: str | None) -> ScalePolicy:
    """Scale 1: the article's "don't divide" case."""
    _no_arg("none", arg)
    return scalar(lambda head_dim: 1.0)


@register("inv_dk")
def inv_dk(arg: str | None) -> ScalePolicy:
    """alpha/d_k (muP, Yang et al. 2021; mup's default alpha is 8)."""
    alpha = parse_number("inv_dk", arg, default=1.0, expects="a positive multiplier alpha")
    return scalar(lambda head_dim: alpha / head_dim)


@register("inv_log_dk")
def inv_log_dk(arg: str | None) -> ScalePolicy:
    """1/ln d_k: the article's log(d_k) case (needs d_k > 1)."""
    _no_arg("inv_log_dk", arg)
    return scalar(lambda head_dim: 1.0 / math.log(head_dim))


@register("const")
def const(arg: str | None) -> ScalePolicy:
    """A fixed number c, whatever d_k."""
    c = parse_number("const", arg, default=None, expects="a positive number c, e.g. const:0.1")
    return scalar(lambda head_dim: c)


@register("gain_aware")
def gain_aware(arg: str | None) -> ScalePolicy:
    """1/(g²·√d_k): undo a q/k projection init gain g.

    With gain g on both projections, every q and k entry has g times the standard deviation of
    the gain-1 case, so Var(q·k) = d_k·(g·σ_q)²·(g·σ_k)² = g⁴·d_k·σ_q²·σ_k²: the logit std grows by
    g², not g (the article's §5.1 suggests 1/(2√d_k) for g = 2; tests/test_policies.py measures).
    """
    g = parse_number("gain_aware", arg, default=None, expects="a positive init gain g, e.g. 2")
    return scalar(lambda head_dim: 1.0 / (g * g * math.sqrt(head_dim)))


# --------------------------------------------------------------------------- learned scales


# Builders of policies with closures are cached: the same settings give the very same functions,
# so two models built from one spec have equal graphdefs and share compiled programs.
@functools.cache
def _learned(per_head: bool, init_value: float | None) -> ScalePolicy:
    def init_fn(rng, *, num_heads, head_dim, base_scale):
        start = init_value if init_value is not None else base_scale
        shape = (num_heads,) if per_head else ()
        # Stored as a log so that gradient steps can never make the scale zero or negative.
        return {"log_scale": jnp.full(shape, math.log(start), jnp.float32)}

    def scale(params, ctx):
        return jnp.exp(params["log_scale"])  # [] or [heads]: broadcasts against [q_len, heads]

    return ScalePolicy(
        base_scale_fn=lambda head_dim: (
            init_value if init_value is not None else 1.0 / math.sqrt(head_dim)
        ),
        scale=scale,
        init_fn=init_fn,
        learned_values=lambda params: {"scale": jnp.exp(params["log_scale"])},
    )


@register("learned")
def learned(arg: str | None) -> ScalePolicy:
    """One positive learnable scalar per layer, initialised at 1/√d_k or at the given value."""
    expects = "a positive initial scale"
    init = None if arg is None else parse_number("learned", arg, default=None, expects=expects)
    return _learned(per_head=False, init_value=init)


@register("learned_per_head")
def learned_per_head(arg: str | None) -> ScalePolicy:
    """One positive learnable scale per head, initialised at 1/√d_k or at the given value."""
    expects = "a positive initial scale"
    init = (
        None if arg is None else parse_number("learned_per_head", arg, default=None, expects=expects)
    )
    return _learned(per_head=True, init_value=init)
