"""Activation coordinates along a scaled axis (mup's `get_coord_data`, Yang et al. 2022 §D):
train each size a few steps and record the mean |x| of each activation family at every step;
the command that plots and judges them is `scale_ablation.coord_check`.

Rules, stated once:
- The axis (`AXES`): `width` sets `model.d_model = w` and `model.head_dim = w · head_dim /
  d_model` of the config (the heads' count fixed, so d_k grows with the width: the axis the
  attention scale acts on); its μP base is the config's `model.base_d_model` (else the smallest
  width), with its head dim by the same ratio. `head_dim` sets the head dim of q, k and v
  together (`model.qk_dim` 0) at the config's d_model and heads; `qk_dim` sets q/k's alone, the
  value width the config's. Along either, μP's base is the smallest size and d_model its own
  (head-dim μP: `model.parametrization`). `num_layers` sets the depth at the config's d_model and
  head dim; its base (`model.base_num_layers`, CompleteP's L_base) is the smallest depth, μP's base
  width the config's d_model (μP's width multipliers are all 1 along it).
- An arm is `PARAMETRIZATION[@ALPHA][:POLICY]`: `@ALPHA` sets `model.depth_alpha` (CompleteP,
  model/depth.py; `sp@1` is CompleteP at a fixed width, where μP is SP), without it the config's.
  Without a policy, under μP the attention scale is μP's own `mup_inv_dk:<base d_k>` and under
  u-μP u-μP's own `inv_dk` (mult/d_head, mult 1: `model.umup`) unless told to keep the config's
  policy, and under SP the config's.
- The learning rate is constant (no warmup; the schedule's cosine stretched over 10⁶ steps),
  as in mup's check. The value "at step t" is the forward pass on step t's batch before its
  update: step 1 is the initialisation.
- The verdict of a quantity is the least-squares slope of log value against log size at the
  last step, averaged over seeds first: "flat" when |slope| <= tolerance, else "grows" or
  "shrinks". SLOPE_TOLERANCE = 0.25: under a quarter of a power of the size (x1.19 per
  doubling), against the slope of 1 that SP's Adam gives the output logits and 0.5 that μP's
  readout gives them at initialisation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from scale_ablation.data import sources as data_lib
from scale_ablation.errors import ConfigError
from scale_ablation.model import umup
from scale_ablation.training import optim, run_config, run_setup
from scale_ablation.training import steps as steps_lib
from scale_ablation.training.experiment_files import apply_overrides

QUANTITIES = ("embedding", "attn_logits", "attn_output", "mlp_output", "residual",
              "output_logits")
SLOPE_TOLERANCE = 0.25
CONSTANT_LR_STEPS = 10**6  # the cosine's length: its value after 10 steps is 1 - 2e-10

CoordData = dict[str, dict[str, dict[str, list[float]]]]  # arm -> size -> quantity -> steps


AXES = ("width", "head_dim", "qk_dim", "num_layers")


def split_arm(arm: str) -> tuple[str, str | None, float | None]:
    """"mup:inv_sqrt_dk" -> ("mup", "inv_sqrt_dk", None); "sp@0.5" -> ("sp", None, 0.5); a bad
    α: ConfigError."""
    head, _, policy = arm.partition(":")
    parametrization, at, alpha = head.partition("@")
    if not at:
        return parametrization, policy or None, None
    try:
        return parametrization, policy or None, float(alpha)
    except ValueError:
        raise ConfigError(f"arm {arm!r}: @{alpha} must be a number (model.depth_alpha)") from None


def _axis_overrides(config: ml_collections.ConfigDict, axis: str, size: int,
                    base: int) -> tuple[dict, int]:
    """(the overrides of one size along `axis`, the base model's d_k); ConfigError naming a bad
    size."""
    m = config.model
    if axis == "width":
        if (size * m.head_dim) % m.d_model or (base * m.head_dim) % m.d_model:
            raise ConfigError(f"--widths: {size} (and the base {base}) times model.head_dim="
                              f"{m.head_dim} / model.d_model={m.d_model} must be whole head dims")
        base_head_dim = base * m.head_dim // m.d_model
        return {"model.d_model": size, "model.head_dim": size * m.head_dim // m.d_model,
                "model.base_d_model": base, "model.base_head_dim": base_head_dim}, base_head_dim
    fixed = {"model.base_d_model": m.d_model}
    if axis == "num_layers":
        return {**fixed, "model.num_layers": size, "model.base_num_layers": base}, (
            m.qk_dim or m.head_dim)
    if axis == "head_dim":
        return {**fixed, "model.head_dim": size, "model.qk_dim": 0,
                "model.base_head_dim": base}, base
    return {**fixed, "model.qk_dim": size, "model.base_head_dim": m.head_dim}, base


def axis_config(config: ml_collections.ConfigDict, axis: str, size: int, arm: str, base: int,
                *, mup_attention: bool = True) -> ml_collections.ConfigDict:
    """The config of one size along `axis` under `arm` (see the module's rules); ConfigError
    naming a bad field."""
    if axis not in AXES:
        raise ConfigError(f"--axis must be one of {', '.join(AXES)}, got {axis!r}")
    overrides, base_dk = _axis_overrides(config, axis, size, base)
    parametrization, policy, alpha = split_arm(arm)
    overrides |= {"model.parametrization": parametrization, "train.warmup_steps": 0,
                  "train.steps": CONSTANT_LR_STEPS}
    if alpha is not None:
        overrides["model.depth_alpha"] = alpha
    if policy is None and mup_attention:
        policy = {"mup": f"mup_inv_dk:{base_dk}", umup.NAME: umup.POLICY}.get(parametrization)
    if policy is not None:
        overrides |= {"policy": policy, "layer_policies": ""}
    out = apply_overrides(config, overrides)
    run_config.validate(out)
    return out


def _programs(config: ml_collections.ConfigDict):
    graphdef, _ = run_setup.init_state(config)
    train_step = jax.jit(steps_lib.make_train_step(graphdef, optim.make_optimizer(config),
                                                   float(config.train.z_loss)))

    @jax.jit
    def coordinates(state, inputs):
        model = nnx.merge(graphdef, state["params"], state["rest"])
        return model.coordinates(inputs)

    return train_step, coordinates


def run_seed(config: ml_collections.ConfigDict, num_steps: int, seed: int,
             programs=None) -> dict[str, list]:
    """quantity -> [mean |x| at step 1, ..., step num_steps] of one seed; `programs`: those of
    `_programs(config)`, which do not depend on the seed (built here when None)."""
    config = apply_overrides(config, {"train.seed": seed})
    train_step, coordinates = programs or _programs(config)
    _, state = run_setup.init_state(config)
    source = data_lib.make_source(config.data, seed=seed)
    found: dict[str, list] = {q: [] for q in QUANTITIES}
    for step in range(num_steps):
        batch = source.train_batch(step, config.train.batch_size, config.data.seq_len)
        arrays = {"inputs": jnp.asarray(batch.inputs), "targets": jnp.asarray(batch.targets),
                  "weights": jnp.asarray(batch.weights)}
        for name, value in coordinates(state, arrays["inputs"]).items():
            found[name].append(float(value))
        state, _ = train_step(state, arrays, steps_lib.dropout_key(seed, step))
    return found


def coord_data(configs: dict[str, dict[int, ml_collections.ConfigDict]], num_steps: int,
               seeds: int) -> CoordData:
    """arm -> size -> quantity -> mean over seeds at each step."""
    out: CoordData = {}
    for name, by_width in configs.items():
        out[name] = {}
        for width, config in by_width.items():
            programs = _programs(config)  # compiled once for every seed
            runs_ = [run_seed(config, num_steps, seed, programs) for seed in range(seeds)]
            out[name][str(width)] = {q: np.mean([r[q] for r in runs_], axis=0).tolist()
                                     for q in QUANTITIES}
    return out


def slope(widths: list[int], values: list[float]) -> float:
    """Least-squares slope of log value against log size."""
    x, y = np.log(np.asarray(widths, float)), np.log(np.asarray(values, float))
    return float(np.polyfit(x, y, 1)[0])


def verdict(value: float, tolerance: float = SLOPE_TOLERANCE) -> str:
    if not math.isfinite(value):
        return "not finite"
    return "flat" if abs(value) <= tolerance else ("grows" if value > 0 else "shrinks")


def verdicts(data: CoordData, tolerance: float = SLOPE_TOLERANCE) -> dict[str, dict[str, dict]]:
    """arm -> quantity -> {"slope", "verdict"} at the last step."""
    out = {}
    for name, by_width in data.items():
        widths = sorted(by_width, key=int)
        out[name] = {}
        for q in QUANTITIES:
            s = slope([int(w) for w in widths], [by_width[w][q][-1] for w in widths])
            out[name][q] = {"slope": s, "verdict": verdict(s, tolerance)}
    return out
