"""Every built-in scale policy written again in NumPy (float64), from its source's formula, for
tests/test_policy_library.py. Nothing here imports the code under test.

A reference is a dict of stages, each optional (missing: the plain attention's):
  qk(params, q, k, d) -> (q, k)            q, k: [B, T, H, D]
  scale(params, positions, k_len, d, heads) -> [Tq, H]   positions: each query's, from 0
  pre(logits, visible) -> logits           raw q·k, before the scale
  post(logits) -> logits                   after the scale
  weights(params, logits, visible, k_len) -> weights   in place of the softmax
"""

from __future__ import annotations

import math

import numpy as np


def softmax(logits, visible):
    logits = np.where(visible, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


def layer_norm(x, axes, eps):
    centred = x - x.mean(axes, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axes, keepdims=True) + eps)


def rms_norm(x, axes, eps):
    return x / np.sqrt((x**2).mean(axes, keepdims=True) + eps)


def fixed(number):
    """A multiplier `number(d)` for every query and head."""
    return {"scale": lambda params, positions, k_len, d, heads: np.full(
        (len(positions), heads), number(d))}


def qk_norm(norm, gain: bool, over_heads: bool, eps: float):
    axes = (-2, -1) if over_heads else (-1,)

    def qk(params, q, k, d):
        def one(x, name):
            out = norm(x, axes, eps)
            if gain:
                out = out * np.asarray(params[name], np.float64).reshape(x.shape[-len(axes):])
            return out
        return one(q, "q_gain"), one(k, "k_gain")

    return {"qk": qk, **fixed(lambda d: d**-0.5)}


def cosine(cap):
    def qk(params, q, k, d):
        unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # noqa: E731
        return unit(q), unit(k)

    def scale(params, positions, k_len, d, heads):
        ell = np.asarray(params["logit_scale"], np.float64)
        return np.broadcast_to(np.exp(np.minimum(ell, math.log(cap))), (len(positions), heads))

    return {"qk": qk, "scale": scale}


def log_length():
    def scale(params, positions, k_len, d, heads):
        s = np.asarray(params["log_length_s"], np.float64)
        return np.log(positions + 1)[:, None] * s[None, :] / math.sqrt(d)  # causal: n = pos + 1

    return {"scale": scale}


def learned():
    def scale(params, positions, k_len, d, heads):
        value = np.exp(np.asarray(params["log_scale"], np.float64))
        return np.broadcast_to(value, (len(positions), heads))

    return {"scale": scale}


def temperature(floor_scale, attn_scale):
    def scale(params, positions, k_len, d, heads):
        # Llama 4: log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1
        tuning = np.log(np.floor((positions + 1.0) / floor_scale) + 1.0) * attn_scale + 1.0
        return np.repeat(tuning[:, None] / math.sqrt(d), heads, 1)

    return {"scale": scale}


def logit_layernorm():
    def pre(logits, visible):
        out = np.zeros_like(logits)
        for index in np.ndindex(logits.shape[:-1]):
            row = logits[index][visible[index[-1]]]
            out[index][visible[index[-1]]] = (row - row.mean()) / np.sqrt(row.var() + 1e-5)
        return out

    return {"pre": pre, **fixed(lambda d: d**-0.5)}


def sigmoid(bias):
    def weights(params, logits, visible, k_len):
        b = -math.log(k_len) if bias is None else bias
        return np.where(visible, 1 / (1 + np.exp(-(logits + b))), 0.0)

    return {"weights": weights, **fixed(lambda d: d**-0.5)}


def sink():
    def weights(params, logits, visible, k_len):
        sink_logit = np.asarray(params["sink"], np.float64)[None, :, None, None]
        exp = np.where(visible, np.exp(logits), 0.0)  # the suite's logits are small: no shift
        return exp / (exp.sum(-1, keepdims=True) + np.exp(sink_logit))

    return {"weights": weights, **fixed(lambda d: d**-0.5)}


def softcap(cap):
    return {"post": lambda logits: cap * np.tanh(logits / cap), **fixed(lambda d: d**-0.5)}


def yarn(factor):
    mscale = 0.1 * math.log(factor) + 1  # YaRN's get_mscale, on q and on k
    return fixed(lambda d: mscale**2 / math.sqrt(d))


REFERENCES = {
    "inv_sqrt_dk": fixed(lambda d: d**-0.5),
    "none": fixed(lambda d: 1.0),
    "inv_dk": fixed(lambda d: 1.0 / d),
    "inv_dk:8": fixed(lambda d: 8.0 / d),
    "mup_inv_dk": fixed(lambda d: 8.0 / d),  # mup's attn_mult/d with its default 8 (= √64)
    "inv_log_dk": fixed(lambda d: 1 / math.log(d)),
    "const:0.1": fixed(lambda d: 0.1),
    "c_inv_sqrt_dk:3": fixed(lambda d: 3.0 / math.sqrt(d)),  # the exponent study's C/√d_k
    "gain_aware:2": fixed(lambda d: 1 / (4 * math.sqrt(d))),
    # Without the model's width (a bare attend) the head width is d_k; layer 0.
    "inv_sqrt_head_width": fixed(lambda d: d**-0.5),
    "inv_layer:2": fixed(lambda d: d**-0.5),
    "yarn:4": yarn(4.0),
    "learned": learned(),
    "learned_per_head": learned(),
    "qk_layernorm": qk_norm(layer_norm, gain=True, over_heads=False, eps=1e-6),
    "qk_rmsnorm": qk_norm(rms_norm, gain=True, over_heads=False, eps=1e-6),
    "qk_rmsnorm_nogain": qk_norm(rms_norm, gain=False, over_heads=False, eps=1e-6),
    "qk_layernorm_global": qk_norm(layer_norm, gain=True, over_heads=True, eps=1e-5),
    "cosine": cosine(100.0),
    "cosine:5": cosine(5.0),
    "log_length": log_length(),
    "temperature:2,0.3": temperature(2.0, 0.3),
    "logit_layernorm": logit_layernorm(),
    "softcap:2": softcap(2.0),
    "sigmoid": sigmoid(None),
    "sigmoid:-1": sigmoid(-1.0),
    "sink": sink(),
    "qk_clip:1": fixed(lambda d: d**-0.5),
}


def composed(first: dict, second: dict, nested: bool) -> dict:
    """`A+B` by hand: A's q/k transform and scale, B's logit stages (each reading its own part
    of the parameters when they nest)."""
    def part(stage_fn, name):
        if not nested:
            return stage_fn
        return lambda params, *args: stage_fn(params[name], *args)

    out = {stage: part(first[stage], "first") for stage in ("qk", "scale") if stage in first}
    for stage in ("pre", "post"):
        if stage in first or stage in second:
            out[stage] = first.get(stage) or second.get(stage)
    if "weights" in second:
        out["weights"] = part(second["weights"], "second")
    elif "weights" in first:
        out["weights"] = part(first["weights"], "first")
    return out


def attend(ref: dict, params, q, k, v, *, causal: bool = True):
    """The reference attention, float64: out [B, Tq, H, Dv] and the weights [B, H, Tq, Tk]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    _, q_len, heads, d = q.shape
    k_len = k.shape[1]
    positions = np.arange(q_len) + (k_len - q_len)
    visible = (np.arange(k_len)[None, :] <= positions[:, None]) if causal else np.ones(
        (q_len, k_len), bool)
    if "qk" in ref:
        q, k = ref["qk"](params, q, k, d)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k)
    if "pre" in ref:
        logits = ref["pre"](logits, visible)
    logits = logits * ref["scale"](params, positions, k_len, d, heads).T[None, :, :, None]
    if "post" in ref:
        logits = ref["post"](logits)
    weights = (ref["weights"](params, logits, visible, k_len) if "weights" in ref
               else softmax(logits, visible))
    return np.einsum("bhqk,bkhd->bqhd", weights, v), weights
