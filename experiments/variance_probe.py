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

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from experiments import base
from scale_ablation.data import sources as data
from scale_ablation.model import diagnostics, policies
from scale_ablation.model.attention import apply_rotary, attend, causal_mask
from scale_ablation.model.build import build_model
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import run_config

KIND = "probe"  # measures without training: `scale_ablation.main` calls run()

# Fixed-scale policies act on the raw projections; the last two normalise q, k or the logits.
RAW_QK = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1", "gain_aware:2", "learned")
NORMALISED = ("qk_layernorm", "logit_layernorm")
# A policy without its own transform_qk carries the dataclass default, the identity.
IDENTITY_QK = policies.ScalePolicy(base_scale_fn=float).transform_qk
# Eager mode compiles each op anew for every shape; jitted, the statistics compile once.
attention_stats = jax.jit(diagnostics.attention_stats)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = base.get_config()
    # Only block 0 is probed; its input is the embedding, whatever the depth.
    config.model.d_model, config.model.num_heads, config.model.num_layers = 256, 4, 1
    config.probe = probe = ml_collections.ConfigDict()
    probe.policies = RAW_QK + NORMALISED
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
    model = build_model(run_config.model_config(config), nnx.Rngs(config.train.seed))
    block, attention = model.blocks[0], model.blocks[0].attention
    batch, seq = tokens.shape
    x = model.embed(tokens)  # (B, T, C)
    if model.position_embed is not None:
        x = x + model.position_embed(jnp.arange(seq))[None]
    h = x if block.post_norm else block.attention_norm(x)
    qk_split = (batch, seq, attention.num_heads, attention.qk_dim)  # (B, T, H, d_k)
    v_split = (batch, seq, attention.num_heads, attention.head_dim)  # (B, T, H, D)
    q, k = (proj(h).reshape(qk_split) for proj in (attention.query, attention.key))
    v = attention.value(h).reshape(v_split)
    if attention.rotary:
        q, k = apply_rotary(q, jnp.arange(seq)), apply_rotary(k, jnp.arange(seq))
    params = attention.policy_params.get_value()
    q_dot, k_dot = attention.policy.transform_qk(params, q, k)  # what enters q·k
    transforms_qk = attention.policy.transform_qk is not IDENTITY_QK
    q_dot, k_dot = np.asarray(q_dot, np.float64), np.asarray(k_dot, np.float64)
    raw = q_dot.transpose(0, 2, 1, 3) @ k_dot.transpose(0, 2, 3, 1)  # (B, H, T, T)
    visible = np.broadcast_to(np.asarray(causal_mask(seq, seq)), raw.shape)
    var_q, var_k, var_qk = q_dot.var(), k_dot.var(), raw[visible].var()

    # The post-scale logits as the layer computes them (same policy, scale and logits dtype).
    scale = {"policy": attention.policy, "params": params, "base_scale": attention.base_scale[...]}
    _, internals = attend(q, k, v, **scale, **dict(attention.precision), return_internals=True)
    stats = attention_stats(internals.logits, internals.probs, internals.mask)
    out_of_band = diagnostics.health_flags(stats)["logit_std_out_of_band"]
    law = attention.qk_dim * var_q * var_k
    return {
        "policy": config.policy,
        "d_k": attention.qk_dim,
        "init_gain": config.model.init_gain,
        "var_q": var_q,
        "var_k": var_k,
        "var_qk_measured": var_qk,
        "var_qk_law": law,
        "ratio": var_qk / law,
        "logit_std_after_scale": float(np.sqrt(np.mean(np.square(stats["logit_std"])))),
        "in_health_band": not bool(out_of_band.any()),
        "qk_measured_on": "policy.transform_qk" if transforms_qk else "projection",
    }


def markdown(results: dict, probe: ml_collections.ConfigDict) -> str:
    def std_cell(row: dict) -> str:
        return f"{row['logit_std_after_scale']:.3g} {'✓' if row['in_health_band'] else '✗'}"

    dims, gains = probe.head_dims, probe.init_gains
    low, high = diagnostics.LOGIT_STD_BAND
    head = "| init gain | " + " | ".join(f"d_k={d}" for d in dims) + " |"
    rule = "|---|---:" + "|---:" * len(dims) + "|"
    lines = [
        "## Variance probe at initialisation",
        "",
        "Law: Var(q·k) = d_k·Var(q)·Var(k), Var(q) and Var(k) measured in the same forward pass "
        "(on the normalised q, k for qk_layernorm). logit_layernorm normalises the raw logits over "
        "the keys before its 1/√d_k, so its post-scale std is not the law's times its scale.",
        "",
        f"### Post-scale logit std (✓: every head in [{low}, {high}])",
        "",
        f"| policy {head}",
        rule,
    ]
    for spec in probe.policies:
        for gain in gains:
            cells = [std_cell(results[spec, d, gain]) for d in dims]
            lines.append(f"| {spec} | {gain:g} | {' | '.join(cells)} |")
    # No policy touches W_q, W_k and all share the seed, so those using the raw q, k measure the
    # same numbers: identical measurements share a row.
    groups: dict[tuple, list[str]] = {}
    for spec in probe.policies:
        key = tuple(results[spec, d, g]["var_qk_measured"] for d in dims for g in gains)
        groups.setdefault(key, []).append(spec)
    lines += ["", "### Var(q·k) measured / law (Var(q), Var(k))", "", f"| policies {head}", rule]
    for specs in groups.values():
        for gain in gains:
            found = [results[specs[0], d, gain] for d in dims]
            cells = [f"{r['ratio']:.3f} ({r['var_q']:.3g}, {r['var_k']:.3g})" for r in found]
            lines.append(f"| {', '.join(specs)} | {gain:g} | {' | '.join(cells)} |")
    return "\n".join([*lines, ""])


def plot(results: dict, probe: ml_collections.ConfigDict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gains = probe.init_gains
    fig, axes = plt.subplots(1, len(gains), figsize=(6 * len(gains), 4.5), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, gain in zip(axes, gains, strict=True):
        ax.axhspan(*diagnostics.LOGIT_STD_BAND, color="green", alpha=0.15, label="health band")
        for i, spec in enumerate(probe.policies):
            stds = [results[spec, d, gain]["logit_std_after_scale"] for d in probe.head_dims]
            # Some policies coincide at initialisation (learned = inv_sqrt_dk): vary the style.
            style = {"marker": "osv^D"[i % 5], "linestyle": ("-", "--", ":", "-.")[i % 4]}
            style["markerfacecolor"] = "none"
            ax.plot(probe.head_dims, stds, **style, label=spec)
        ax.set(xscale="log", yscale="log", xlabel="d_k (head_dim)", title=f"init gain {gain:g}")
        ax.set_xticks(list(probe.head_dims), [str(d) for d in probe.head_dims])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes[0].set_ylabel("post-scale logit std at initialisation")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
    """Probe every policy × d_k × init gain, write the CSV, markdown and plot; return the rows."""
    probe = config.probe
    dims, gains = tuple(probe.head_dims), tuple(probe.init_gains)
    if not dims or min(dims) < 2 or len(set(dims)) < len(dims):
        raise ValueError(f"probe.head_dims must be distinct integers >= 2, got {dims}")
    if not gains or min(gains) <= 0 or probe.batch_size < 1:
        raise ValueError(
            f"need positive probe.init_gains, batch_size >= 1; got {gains}, {probe.batch_size}"
        )
    for spec in probe.policies:
        policies.get(spec)  # an unknown policy fails here, before any work
    source = data.make_source(config.data, config.train.seed)
    batches = source.val_batches(probe.batch_size, config.data.seq_len, config.data.val_batches)
    tokens = np.concatenate([b.inputs for b in batches])  # (B, T)
    results = {}
    for spec in probe.policies:
        for d in dims:
            for gain in gains:
                point = {"policy": spec, "model.head_dim": d, "model.init_gain": gain}
                results[spec, d, gain] = measure(experiment.apply_overrides(config, point), tokens)
    rows = list(results.values())

    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "variance_probe.csv"), "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:  # 6 significant digits: enough for every check, readable by eye
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
    text = markdown(results, probe)
    with open(os.path.join(workdir, "variance_probe.md"), "w") as file:
        file.write(text)
    plot(results, probe, os.path.join(workdir, "variance_probe.png"))
    print(text)
    return rows
