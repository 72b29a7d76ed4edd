"""c·d_k^(-1/2) with the multiplier c as the policy's argument: the family that the optimal
scale's exponent is measured over (experiments/dk_exponent.py).

`c_inv_sqrt_dk:C` is C/√d_k. If the best C at each d_k is the same, 1/√d_k has the right
exponent; if the best C falls as d_k^(-1/2), the right scale is 1/d_k (μP); if it grows as
d_k^(1/2), no divisor at all. C = 1 is `inv_sqrt_dk` itself, which keeps its own name (a new
argument on it would leave every existing spec and run name as it is, but two spellings of one
run would then differ in name only); the study runs C = 1 as `inv_sqrt_dk`.

Built with `policies.scalar`, so every C (and 1/√d_k, 1/d_k, a constant...) compiles to one
program and the C values of one d_k train as one vmapped ensemble.

Imported by the registry on its first lookup (`policies.BUILTIN_MODULES`).
"""

from __future__ import annotations

import math

from scale_ablation.model.policies import ScalePolicy, parse_number, register, scalar

NAME = "c_inv_sqrt_dk"


@register(NAME)
def c_inv_sqrt_dk(arg: str | None) -> ScalePolicy:
    """C/√d_k for a positive multiplier C (`c_inv_sqrt_dk:4`)."""
    c = parse_number(NAME, arg, default=None, expects="a positive multiplier C, e.g. "
                     f"{NAME}:2")
    return scalar(lambda head_dim: c / math.sqrt(head_dim))


def multiplier(spec: str) -> float | None:
    """C of a spec of this family (`c_inv_sqrt_dk:C`; `inv_sqrt_dk` is C = 1), else None."""
    name, _, arg = str(spec).partition(":")
    if name == "inv_sqrt_dk" and not arg:
        return 1.0
    if name != NAME:
        return None
    return parse_number(NAME, arg or None, default=None, expects="a positive multiplier C")
