"""Synthetic runs shaped like a shipped sweep's (its real grid of overrides), with metrics given
by closed-form functions of (policy, init, d_k, seed, step), so that plots can be rendered at
the shipped sizes without training and their drawn values checked against numpy."""

from __future__ import annotations

import copy
import math

UNIGRAM_BPB, BIGRAM_BPB = 4.9, 3.3
BASELINES = {"baseline_unigram_bpb": UNIGRAM_BPB, "baseline_bigram_bpb": BIGRAM_BPB}


def apply(config: dict, overrides: dict) -> dict:
    out = copy.deepcopy(config)
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = out
        for name in parents:
            node = node[name]
        node[leaf] = value
    return out


def bpb(policy_index: int, init: str, d_k: int, seed: int, step: int, lr: float) -> float:
    """Validation bits per byte: a decay from 8 to a floor above the bigram baseline."""
    floor = BIGRAM_BPB + 0.1 + 0.04 * policy_index + (0.05 if init == "gpt2" else 0.0)
    floor += 0.02 * math.log2(d_k) + 0.01 * seed + 3 * abs(math.log10(lr / 3e-3)) / 10
    return floor + (8 - floor) * math.exp(-step / 60)


def max_logit(policy_index: int, layer: int, d_k: int, seed: int, step: int) -> float:
    return (2 + policy_index) * (1 + layer) * math.sqrt(d_k) * (1 + step / 100) * (1.1 ** seed)


def diverges(policy: str, d_k: int, lr: float) -> bool:
    return (policy == "none" and d_k >= 512) or (policy == "inv_dk" and lr >= 3e-2)


def run(config: dict, overrides: dict, policies: list[str], steps: tuple[int, ...]) -> dict:
    config = apply(config, overrides)
    policy, d_k = config["policy"], config["model"]["head_dim"]
    seed, lr, init = config["train"]["seed"], config["train"]["lr"], config["model"]["init"]
    index = policies.index(policy)
    stop = steps[len(steps) // 2] if diverges(policy, d_k, lr) else None
    metrics = []
    for step in steps:
        value = bpb(index, init, d_k, seed, step, lr)
        row = {"step": step, "val/loss": value * math.log(2), "val/bpb": value}
        for layer in (0, 1):
            row[f"attn/layer{layer}/entropy"] = 2.0 - step / 1000
            row[f"attn/layer{layer}/entropy_normalised"] = 0.9 - 0.1 * index * step / steps[-1]
            row[f"attn/layer{layer}/max_abs_logit"] = max_logit(index, layer, d_k, seed, step)
            if policy.startswith("learned"):
                row[f"attn/layer{layer}/learned_scale"] = 1 / math.sqrt(d_k) * (1 + 1 / (1 + step))
        if stop is not None and step > stop:
            row = {k: (float("nan") if k != "step" else v) for k, v in row.items()}
        metrics.append(row)
    final = metrics[-1]["val/bpb"]
    summary = ({"status": "diverged", "diverged_at_step": stop} if stop is not None else
               {"status": "completed", "final_val_bpb": final, "final_val_loss": final * math.log(2)})
    name = ",".join(f"{k}={v}" for k, v in overrides.items())
    return {"name": name, "overrides": overrides, "config": config, "metrics": metrics,
            "summary": {"steps_completed": steps[-1], **summary}}


def runs(config: dict, points: list[dict], steps: tuple[int, ...]) -> list[dict]:
    """One synthetic run per point (a sweep's overrides) on `config` (a config dict)."""
    policies = list(dict.fromkeys(p.get("policy", config["policy"]) for p in points))
    return [run(config, point, policies, steps) for point in points]
