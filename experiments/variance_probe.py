r"""The variance law in the real model at initialisation: Var(q·k) = d_k·σ_q²·σ_k², no training.

  python -m scale_ablation.main --config=experiments/variance_probe.py --workdir=runs/variance_probe
  python -m scale_ablation.main --config=experiments/variance_probe.py:quick --workdir=runs/variance_quick

Claims 1 and 5: for each policy × d_k × q/k init gain, Shakespeare bytes go through the embedding
and the first block's attention norm; σ_q², σ_k² are the variances of the q and k entries measured
in that pass and Var(q·k) is measured over the causally visible (query, key) pairs, pooled over
heads. QK-norm policies transform q and k before the dot product: for them the measurement is on
the transformed q, k (column qk_measured_on). The post-scale logit std is the library's
`diagnostics.attention_stats` (root mean square over heads); in_health_band means every head is
in `diagnostics.LOGIT_STD_BAND`. Writes variance_probe.csv, .md and .png into the workdir.
"""

from __future__ import annotations

import csv
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from experiments import base
from scale_ablation import data, diagnostics, experiment, policies
from scale_ablation.attention import apply_rotary, attend, causal_mask
from scale_ablation.model import build_model

COLUMNS = ("policy", "d_k", "init_gain", "var_q", "var_k", "var_qk_measured", "var_qk_law",
           "ratio", "logit_std_after_scale", "in_health_band", "qk_measured_on")
# A policy without its own transform_qk carries the dataclass default, the identity.
IDENTITY_QK = policies.ScalePolicy(base_scale_fn=float).transform_qk


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = base.get_config()
    # Only block 0 is probed; its input is the embedding, whatever the depth.
    config.model.d_model, config.model.num_heads, config.model.num_layers = 256, 4, 1
    config.probe = probe = ml_collections.ConfigDict()
    probe.policies = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1", "gain_aware:2",
                      "learned", "qk_layernorm", "logit_layernorm")
    probe.head_dims = (16, 64, 256, 1024)  # d_k per head, decoupled from d_model
    probe.init_gains = (1.0, 2.0)  # model.init_gain: Xavier gain of the q/k projections
    probe.batch_size = 8  # sequences per validation batch; data.val_batches batches
    if arg == "quick":
        probe.head_dims = (16, 64, 256)
        probe.batch_size, config.data.val_batches, config.data.seq_len = 4, 2, 64
    elif arg:
        raise ValueError(f"experiments/variance_probe.py: unknown variant {arg!r} (quick)")
    return config


def measure(config: ml_collections.ConfigDict, tokens: np.ndarray) -> dict:
    """One grid point: the model's first attention layer at initialisation on `tokens` [B, T]."""
    model = build_model(config, nnx.Rngs(config.train.seed))
    block, attention = model.blocks[0], model.blocks[0].attention
    batch, seq = tokens.shape
    x = model.embed(tokens)  # (B, T, C)
    if model.position_embed is not None:
        x = x + model.position_embed(jnp.arange(seq))[None]
    h = x if block.post_norm else block.attention_norm(x)
    split = (batch, seq, attention.num_heads, attention.head_dim)
    q, k, v = (proj(h).reshape(split) for proj in (attention.query, attention.key, attention.value))
    if attention.rotary:
        q, k = apply_rotary(q, jnp.arange(seq)), apply_rotary(k, jnp.arange(seq))
    params = attention.policy_params.get_value()
    q_dot, k_dot = attention.policy.transform_qk(params, q, k)  # what enters q·k
    q_dot, k_dot = np.asarray(q_dot, np.float64), np.asarray(k_dot, np.float64)
    raw = np.einsum("bqhd,bkhd->bhqk", q_dot, k_dot)  # (B, H, T, T)
    visible = np.broadcast_to(np.asarray(causal_mask(seq, seq)), raw.shape)
    var_q, var_k, var_qk = q_dot.var(), k_dot.var(), raw[visible].var()

    _, internals = attend(q, k, v, policy=attention.policy, params=params, causal=True,
                          base_scale=attention.base_scale[...], logits_dtype=attention.logits_dtype,
                          return_internals=True)
    stats = diagnostics.attention_stats(internals.logits, internals.probs, internals.mask)
    law = attention.head_dim * var_q * var_k
    return {
        "policy": config.policy, "d_k": attention.head_dim, "init_gain": config.model.init_gain,
        "var_q": var_q, "var_k": var_k, "var_qk_measured": var_qk, "var_qk_law": law,
        "ratio": var_qk / law,
        "logit_std_after_scale": float(np.sqrt(np.mean(np.square(stats["logit_std"])))),
        "in_health_band": not bool(diagnostics.health_flags(stats)["logit_std_out_of_band"].any()),
        "qk_measured_on": "projection" if attention.policy.transform_qk is IDENTITY_QK
        else "policy.transform_qk",
    }


def markdown(rows: list[dict], probe: ml_collections.ConfigDict) -> str:
    def table(title: str, gain: float, cell) -> list[str]:
        head = "| policy | " + " | ".join(f"d_k={d}" for d in probe.head_dims) + " |"
        lines = [f"### {title}, init gain {gain:g}", "", head, "|---" + "|---:" * len(probe.head_dims) + "|"]
        for spec in probe.policies:
            found = {r["d_k"]: r for r in rows if r["policy"] == spec and r["init_gain"] == gain}
            lines.append(f"| {spec} | " + " | ".join(cell(found[d]) for d in probe.head_dims) + " |")
        return [*lines, ""]

    low, high = diagnostics.LOGIT_STD_BAND
    out = ["## Variance probe at initialisation", "",
           "Law: Var(q·k) = d_k·Var(q)·Var(k), with Var(q), Var(k) measured in the same forward "
           "pass (on the normalised q, k for QK-norm policies). logit_layernorm normalises the raw "
           "logits over keys before its 1/√d_k, so its post-scale std is not the law's times the "
           f"scale. ✓: every head's post-scale logit std in [{low}, {high}].", ""]
    for gain in probe.init_gains:
        out += table("Post-scale logit std", gain,
                     lambda r: f"{r['logit_std_after_scale']:.3g} {'✓' if r['in_health_band'] else '✗'}")
        out += table("Var(q·k) measured / law", gain, lambda r: f"{r['ratio']:.3f}")
        out += table("Var(q), Var(k) of the entries entering q·k", gain,
                     lambda r: f"{r['var_q']:.3g}, {r['var_k']:.3g}")
    return "\n".join(out)


def plot(rows: list[dict], probe: ml_collections.ConfigDict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gains = list(probe.init_gains)
    fig, axes = plt.subplots(1, len(gains), figsize=(6 * len(gains), 4.5), sharey=True,
                             squeeze=False)
    for ax, gain in zip(axes[0], gains, strict=True):
        ax.axhspan(*diagnostics.LOGIT_STD_BAND, color="green", alpha=0.15, label="health band")
        for spec in probe.policies:
            points = sorted((r["d_k"], r["logit_std_after_scale"]) for r in rows
                            if r["policy"] == spec and r["init_gain"] == gain)
            ax.plot(*zip(*points, strict=True), marker="o", label=spec)
        ax.set(xscale="log", yscale="log", xlabel="d_k (head_dim)", title=f"init gain {gain:g}")
        ax.set_xticks(list(probe.head_dims), [str(d) for d in probe.head_dims])
    axes[0][0].set_ylabel("post-scale logit std at init")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
    """Probe every policy × d_k × init gain and write the CSV, markdown and plot."""
    probe = config.probe
    if not probe.head_dims or min(probe.head_dims) < 2:
        raise ValueError(f"probe.head_dims must be integers >= 2, got {tuple(probe.head_dims)}")
    if not probe.init_gains or min(probe.init_gains) <= 0 or probe.batch_size < 1:
        raise ValueError(f"probe.init_gains must be positive and probe.batch_size >= 1, got "
                         f"{tuple(probe.init_gains)}, {probe.batch_size}")
    for spec in probe.policies:
        policies.get(spec)  # an unknown policy fails here, before any work
    batches = data.make_source(config.data, config.train.seed).val_batches(
        probe.batch_size, config.data.seq_len, config.data.val_batches)
    tokens = np.concatenate([b.inputs for b in batches])  # (B, T)
    rows = [
        measure(experiment.apply_overrides(
            config, {"policy": spec, "model.head_dim": d, "model.init_gain": gain}), tokens)
        for spec in probe.policies for d in probe.head_dims for gain in probe.init_gains
    ]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "variance_probe.csv"), "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({key: f"{value:.6g}" if isinstance(value, float) else value
                             for key, value in r.items()})
    text = markdown(rows, probe)
    with open(os.path.join(workdir, "variance_probe.md"), "w") as file:
        file.write(text)
    plot(rows, probe, os.path.join(workdir, "variance_probe.png"))
    print(text)
    return rows
