"""Scale policies: what multiplies the raw attention logits q·k before the softmax.

A policy is a small bundle of pure functions (see `ScalePolicy`). It may transform q and k
(QK-norm) or the raw logits (the article's pitfall 2), and it returns a multiplier per head and
per query. It never touches V and always acts before the softmax, per head.

Add a policy in one function:

    @policies.register("half_sqrt")
    def half_sqrt(arg: str | None) -> policies.ScalePolicy:
        return policies.scalar(lambda head_dim: 0.5 / head_dim**0.5)

A name can be registered once (a second `register` of it raises ValueError naming both modules).
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
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Params = Any  # a pytree of arrays
PolicyFactory = Callable[[str | None], "ScalePolicy"]


@dataclasses.dataclass(frozen=True)
class ScaleContext:
    """What a policy may look at when it computes its multiplier."""

    head_dim: int
    base_scale: jax.Array  # scalar, traced: the policy's plain number (`ScalePolicy.base_scale`)
    num_keys: jax.Array  # [q_len] float32: keys each query attends to (causal: position + 1)


def _identity_qk(params: Params, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    return q, k


def _no_params(rng: jax.Array, *, num_heads: int, head_dim: int, base_scale: float) -> Params:
    return {}


def _use_base_scale(params: Params, ctx: ScaleContext) -> jax.Array:
    return ctx.base_scale


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

    def base_scale(self, head_dim: int) -> float:
        return float(self.base_scale_fn(head_dim))

    def init(self, rng: jax.Array, *, num_heads: int, head_dim: int) -> Params:
        """The policy's trainable parameters as a pytree ({} for fixed policies)."""
        return self.init_fn(
            rng, num_heads=num_heads, head_dim=head_dim, base_scale=self.base_scale(head_dim)
        )



def scalar(base_scale_fn: Callable[[int], float]) -> ScalePolicy:
    """A policy whose scale is the plain number `base_scale_fn(head_dim)`."""
    return ScalePolicy(base_scale_fn=base_scale_fn)


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, PolicyFactory] = {}
ENTRY_POINT_GROUP = "scale_ablation.policies"
_installed = {"loaded": False}  # entry points are imported once, on first lookup


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Decorator: register `factory(arg: str | None) -> ScalePolicy` under `name`."""
    if not name or ":" in name:
        raise ValueError(f"policy name {name!r} must be non-empty and contain no ':'")

    def decorate(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY:
            # Silently replacing a policy would change what every run of that name measures.
            first = getattr(_REGISTRY[name], "__module__", "?")
            raise ValueError(f"scale policy {name!r} is registered twice: by {first} and by "
                             f"{getattr(factory, '__module__', '?')}")
        _REGISTRY[name] = factory
        return factory

    return decorate


def _load_installed() -> None:
    """Import the modules that installed packages name in the `scale_ablation.model.policies` group.

    Once per process, on the first `available()` or `get()`; a module that fails to import is
    reported as a ValueError naming the entry point and its package.
    """
    if _installed["loaded"]:
        return
    _installed["loaded"] = True  # set first: a plugin may itself look policies up on import
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


def get(spec: str) -> ScalePolicy:
    """A policy from a spec string `name` or `name:arg` (e.g. `const:0.1`, `inv_dk:8`)."""
    name, _, arg = str(spec).partition(":")
    _load_installed()
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


# --------------------------------------------------------------------------- QK normalisation


@functools.cache
def _qk_norm(center: bool) -> ScalePolicy:
    def init_fn(rng, *, num_heads, head_dim, base_scale):
        return {"q_gain": jnp.ones((head_dim,), jnp.float32),
                "k_gain": jnp.ones((head_dim,), jnp.float32)}

    def normalise(x, gain):
        x32 = x.astype(jnp.float32)
        if center:
            x32 = x32 - x32.mean(-1, keepdims=True)
        x32 = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)
        return (x32 * gain).astype(x.dtype)

    def transform_qk(params, q, k):
        return normalise(q, params["q_gain"]), normalise(k, params["k_gain"])

    return ScalePolicy(
        base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim),
        init_fn=init_fn,
        transform_qk=transform_qk,
    )


@register("qk_layernorm")
def qk_layernorm(arg: str | None) -> ScalePolicy:
    """LayerNorm of q and k over head_dim with learnable gain, then 1/√d_k (Dehghani et al. 2023)."""
    _no_arg("qk_layernorm", arg)
    return _qk_norm(center=True)


@register("qk_rmsnorm")
def qk_rmsnorm(arg: str | None) -> ScalePolicy:
    """RMSNorm of q and k over head_dim with learnable gain, then 1/√d_k (Wortsman et al. 2023)."""
    _no_arg("qk_rmsnorm", arg)
    return _qk_norm(center=False)


# --------------------------------------------------------------------------- length-aware


@register("log_length")
def log_length(arg: str | None) -> ScalePolicy:
    """s·ln(n)/√d_k with n the keys a query sees and s learnable per head (Nakanishi 2025)."""
    return _log_length(parse_number("log_length", arg, default=1.0, expects="a positive initial s"))


@functools.cache
def _log_length(s_init: float) -> ScalePolicy:
    def init_fn(rng, *, num_heads, head_dim, base_scale):
        return {"log_length_s": jnp.full((num_heads,), s_init, jnp.float32)}

    def scale(params, ctx):
        # [q_len, 1] * [heads] -> [q_len, heads]
        return jnp.log(ctx.num_keys)[:, None] * params["log_length_s"] * ctx.base_scale

    return ScalePolicy(
        base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim),
        scale=scale,
        init_fn=init_fn,
        learned_values=lambda params: {"log_length_s": params["log_length_s"]},
    )


# --------------------------------------------------------------------------- pitfall 2


def _layernorm_over_keys(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Normalise each query's row of raw logits over the keys it can see."""
    if mask is None:
        mean = logits.mean(-1, keepdims=True)
        var = ((logits - mean) ** 2).mean(-1, keepdims=True)
    else:
        count = mask.sum(-1, keepdims=True)
        mean = jnp.where(mask, logits, 0).sum(-1, keepdims=True) / count
        var = jnp.where(mask, (logits - mean) ** 2, 0).sum(-1, keepdims=True) / count
    return (logits - mean) * jax.lax.rsqrt(var + 1e-5)


@register("logit_layernorm")
def logit_layernorm(arg: str | None) -> ScalePolicy:
    """LayerNorm over the key axis of q·k, then 1/√d_k: the article's pitfall 2, kept to measure."""
    _no_arg("logit_layernorm", arg)
    return ScalePolicy(
        base_scale_fn=lambda head_dim: 1.0 / math.sqrt(head_dim),
        transform_logits=_layernorm_over_keys,
    )
