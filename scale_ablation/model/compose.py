"""Composition of scale policies: `A+B` applies A's q/k transform and scale, then B's logit
transform (e.g. `qk_rmsnorm+softcap:30`, `inv_dk+sink`, `sink+softcap:30`), or A's q/k
transform with B's own scale (`qk_rmsnorm_nogain+learned`: a learned scale on normalised q, k).

Rules, each refused with one line (ValueError) where broken:
- only A may transform q and k or clip W_Q/W_K (`qk_clip`): B's would be silently dropped;
- B must bring a logit transform (a raw-logit transform, a post-scale transform such as the
  soft-cap, or weights in place of the softmax) or a scale of its own (a `scale` function: a
  learned or position-dependent multiplier), which then replaces A's; a plain number of B's
  alone would be ignored;
- B's own scale replaces only a plain number: A's scale must not be a function too;
- each of those three stages is filled by at most one of A and B.
`A+B+C` composes left to right. Parameters nest as {"first": A's, "second": B's} when either has
any; a composition of parameter-free policies has none.
"""

from __future__ import annotations

import dataclasses
import functools

from scale_ablation.model import policies
from scale_ablation.model.policies import (
    Params,
    ScalePolicy,
    _identity_qk,
    _no_params,
    _use_base_scale,
)

# The logit stages B may fill, with how a refusal names them.
_LOGIT_STAGES = {
    "transform_logits": "transform the raw logits",
    "transform_scaled": "transform the scaled logits",
    "weights": "replace the softmax",
}


def compose(first: ScalePolicy, second: ScalePolicy) -> ScalePolicy:
    """`first+second` (see the module's rules); ValueError naming both specs where they cannot
    compose."""
    _check(first, second)
    composed = _compose_functions(first, second)
    # The cache key ignores the plain numbers (compare=False): take them from this scale owner.
    owner = _scale_owner(first, second)
    return dataclasses.replace(composed, base_scale_fn=owner.base_scale_fn,
                               base_scale_dims=owner.base_scale_dims,
                               spec=f"{first.spec}+{second.spec}")


def _scale_owner(first: ScalePolicy, second: ScalePolicy) -> ScalePolicy:
    """The part whose scale the composition uses: B when it has a scale function of its own."""
    return second if second.scale is not _use_base_scale else first


def _check(first: ScalePolicy, second: ScalePolicy) -> None:
    name = f"policy '{first.spec}+{second.spec}'"
    if second.transform_qk is not _identity_qk or second.qk_clip is not None:
        raise ValueError(f"{name}: '{second.spec}' acts on q and k (or W_Q/W_K), which only the "
                         "first policy of a composition may do; write it first")
    stages = [stage for stage in _LOGIT_STAGES if getattr(second, stage) is not None]
    own_scale = second.scale is not _use_base_scale
    if not stages and not own_scale:
        raise ValueError(f"{name}: '{second.spec}' has no logit transform or scale function to "
                         "add (its plain number would be ignored)")
    if own_scale and first.scale is not _use_base_scale:
        raise ValueError(f"{name}: both policies compute the scale; only one may")
    for stage in stages:
        if getattr(first, stage) is not None:
            raise ValueError(f"{name}: both policies {_LOGIT_STAGES[stage]}; only one may")


@functools.cache
def _compose_functions(first: ScalePolicy, second: ScalePolicy) -> ScalePolicy:
    """The composed functions, cached so that equal parts give equal (program-sharing) policies."""
    nested = first.init_fn is not _no_params or second.init_fn is not _no_params

    def part(params: Params, index: int) -> Params:
        return params[("first", "second")[index]] if nested else {}

    def init_fn(rng, *, num_heads, head_dim, base_scale):
        return {"first": first.init_fn(rng, num_heads=num_heads, head_dim=head_dim,
                                       base_scale=base_scale),
                "second": second.init_fn(rng, num_heads=num_heads, head_dim=head_dim,
                                         base_scale=second.base_scale(head_dim))}

    scaler = _scale_owner(first, second)
    scaler_index = 1 if scaler is second else 0
    owner = second if second.weights is not None else first
    weights = None
    if owner.weights is not None:
        index = 1 if owner is second else 0

        def weights(params, logits, mask, seq_len):
            return owner.weights(part(params, index), logits, mask, seq_len)

    def learned_values(params):
        values = {}
        for index, policy in enumerate((first, second)):
            if policy.learned_values is not None:
                values.update(policy.learned_values(part(params, index)))
        return values

    return ScalePolicy(
        base_scale_fn=scaler.base_scale_fn,
        scale=lambda params, ctx: scaler.scale(part(params, scaler_index), ctx),
        init_fn=init_fn if nested else _no_params,
        transform_qk=lambda params, q, k: first.transform_qk(part(params, 0), q, k),
        transform_logits=first.transform_logits or second.transform_logits,
        transform_scaled=first.transform_scaled or second.transform_scaled,
        weights=weights,
        weights_sum_to_one=owner.weights_sum_to_one,
        learned_values=learned_values if nested else None,
        qk_clip=first.qk_clip,
        soft_cap=first.soft_cap if first.transform_scaled is not None else second.soft_cap,
    )


policies.register_composer(compose)
