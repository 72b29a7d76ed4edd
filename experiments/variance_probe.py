r"""The variance law in the real model at initialisation: Var(q·k) = d_k·σ_q²·σ_k², no training.

  python -m scale_ablation.main --config=experiments/variance_probe.py --workdir=runs/variance_probe
  python -m scale_ablation.main --config=experiments/variance_probe.py:quick --workdir=runs/variance_quick

Claims 1 and 5: for each policy × init (`model.init`: fan_in, gpt2) × d_k × q/k init gain
(`model.init_gain`), Shakespeare bytes go through the embedding and the first block's attention
norm; σ_q², σ_k² are the variances of the q and k entries measured in that pass and Var(q·k) is
measured over the causally visible (query, key) pairs, pooled over heads. QK-norm policies
transform q and k before the dot product: for them the measurement is on the transformed q, k
(column qk_measured_on). The post-scale logit std is the library's
`diagnostics.attention_stats` (root mean square over heads); in_health_band means every head is
in `diagnostics.LOGIT_STD_BAND`. The law's rule (`law_verdict`): it holds in a cell when the
measured Var(q·k) / law is within LAW_BAND = [0.9², 1.1²], i.e. it predicts the logit std within
±10% (`logit_drift.LAW_TOLERANCE`, half the health band's ±20%; the drift table applies it to
its step 0 too), judged once per distinct measurement (the policies that use the raw q, k share
theirs). Writes variance_probe.csv, .md and .png into the workdir; the full variant also writes
the logit std's drift over training in published runs (`analysis.logit_drift` on
probe.drift_store: logit_drift.md, .png). The full grid, 9 policies × 2 inits × 4 d_k × 2 gains
(144 points), took 317 s of wall time (135 s of user CPU; load average 4–7) on a 2-core VM,
well under the 15 minutes one core may take, so the grid is not cut; quick takes about 22 s.
"""

from __future__ import annotations

import csv
import itertools
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from experiments import base
from scale_ablation.analysis import logit_drift
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
# measured / law Var(q·k): the law's logit std within ±10%, the drift table's tolerance at step 0
LAW_BAND = ((1 - logit_drift.LAW_TOLERANCE) ** 2, (1 + logit_drift.LAW_TOLERANCE) ** 2)
# Eager mode compiles each op anew for every shape; jitted, the statistics compile once.
attention_stats = jax.jit(diagnostics.attention_stats)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = base.get_config()
    # Only block 0 is probed; its input is the embedding, whatever the depth.
    config.model.d_model, config.model.num_heads, config.model.num_layers = 256, 4, 1
    config.probe = probe = ml_collections.ConfigDict()
    probe.policies = RAW_QK + NORMALISED
    probe.head_dims = (16, 64, 256, 1024)  # d_k per head, decoupled from d_model
    probe.inits = ("fan_in", "gpt2")  # model.init: std gain/√fan_in, or gain·0.02
    probe.init_gains = (1.0, 2.0)  # model.init_gain: the q/k projections' std multiplier
    probe.batch_size = 8  # sequences per validation batch; data.val_batches batches
    # The published runs whose logit std over training `logit_drift` tabulates ("": none).
    probe.drift_store = "experiments/results/dk_exponent_cpu/runs.parquet"
    if arg == "quick":
        probe.head_dims, probe.drift_store = (16, 64, 256), ""
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
        "init": config.model.init,
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


def _grid(probe: ml_collections.ConfigDict) -> list[tuple[str, str, int, float]]:
    """Every grid point (policy, init, d_k, gain), in the order the probe measures them."""
    return [(spec, init, d, gain) for spec in probe.policies for init in probe.inits
            for d in probe.head_dims for gain in probe.init_gains]


def _header(probe: ml_collections.ConfigDict, first: str) -> list[str]:
    dims = probe.head_dims
    return [f"| {first} | init | init gain | " + " | ".join(f"d_k={d}" for d in dims) + " |",
            "|---|---|---:" + "|---:" * len(dims) + "|"]


def std_table(results: dict, probe: ml_collections.ConfigDict) -> list[str]:
    """Post-scale logit std per policy, init and gain (✓: every head in the health band)."""
    lines = _header(probe, "policy")
    for spec in probe.policies:
        for init in probe.inits:
            for gain in probe.init_gains:
                found = [results[spec, init, d, gain] for d in probe.head_dims]
                cells = [f"{r['logit_std_after_scale']:.3g} {'✓' if r['in_health_band'] else '✗'}"
                         for r in found]
                lines.append(f"| {spec} | {init} | {gain:g} | {' | '.join(cells)} |")
    return lines


def distinct_measurements(results: dict, probe: ml_collections.ConfigDict) -> dict:
    """(init, policies sharing it) -> {(d_k, gain): row}. No policy touches W_q, W_k and all
    share the seed, so the policies that use the raw q, k measure the same numbers."""
    dims, gains = probe.head_dims, probe.init_gains
    groups: dict[tuple, list[str]] = {}
    for init in probe.inits:
        for spec in probe.policies:
            key = (init, *(results[spec, init, d, g]["var_qk_measured"] for d in dims for g in gains))
            groups.setdefault(key, []).append(spec)
    return {(key[0], tuple(specs)): {(d, g): results[specs[0], key[0], d, g]
                                     for d in dims for g in gains}
            for key, specs in groups.items()}


def ratio_table(results: dict, probe: ml_collections.ConfigDict) -> list[str]:
    lines = _header(probe, "policies")
    for (init, specs), rows in distinct_measurements(results, probe).items():
        for gain in probe.init_gains:
            found = [rows[d, gain] for d in probe.head_dims]
            cells = [f"{r['ratio']:.3f} ({r['var_q']:.3g}, {r['var_k']:.3g})" for r in found]
            lines.append(f"| {', '.join(specs)} | {init} | {gain:g} | {' | '.join(cells)} |")
    return lines


def law_verdict(results: dict, probe: ml_collections.ConfigDict) -> list[str]:
    """The rule applied to every distinct measurement: measured / law within LAW_BAND."""
    low, high = LAW_BAND
    cells = [(init, specs[0], d, g, row["ratio"])
             for (init, specs), rows in distinct_measurements(results, probe).items()
             for (d, g), row in rows.items()]
    failed = [c for c in cells if not low <= c[-1] <= high]
    ratios = [c[-1] for c in cells]
    verdict = "holds" if not failed else "fails"
    tolerance, (band_low, band_high) = logit_drift.LAW_TOLERANCE, diagnostics.LOGIT_STD_BAND
    lines = [f"Rule: the law holds in a cell when measured / law is within [{low:.2f}, "
             f"{high:.2f}] (the law's logit std within ±{tolerance:.0%}; the health band is "
             f"[{band_low}, {band_high}]), judged once per distinct measurement (a row of the "
             "table above × d_k).",
             "",
             f"**Result: the law {verdict}**: {len(cells) - len(failed)} of {len(cells)} cells "
             f"within the band; measured / law from {min(ratios):.3f} to {max(ratios):.3f}."]
    lines += [f"- outside: {spec} ({init}, d_k {d}, gain {g:g}): {r:.3f}"
              for init, spec, d, g, r in failed]
    return lines


def markdown(results: dict, probe: ml_collections.ConfigDict) -> str:
    low, high = diagnostics.LOGIT_STD_BAND
    return "\n".join([
        "## Variance probe at initialisation",
        "",
        "Law: Var(q·k) = d_k·Var(q)·Var(k), Var(q) and Var(k) measured in the same forward pass "
        "(on the normalised q, k for qk_layernorm). logit_layernorm normalises the raw logits over "
        "the keys before its 1/√d_k, so its post-scale std is not the law's times its scale.",
        "",
        f"### Post-scale logit std (✓: every head in [{low}, {high}])",
        "",
        *std_table(results, probe),
        "",
        "### Var(q·k) measured / law (Var(q), Var(k))",
        "",
        *ratio_table(results, probe),
        "",
        "### Does the law hold?",
        "",
        *law_verdict(results, probe),
        "",
    ])


def plot(results: dict, probe: ml_collections.ConfigDict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inits, gains = probe.inits, probe.init_gains
    low, high = diagnostics.LOGIT_STD_BAND
    fig, axes = plt.subplots(len(inits), len(gains), figsize=(6 * len(gains), 4 * len(inits)),
                             sharey=True, squeeze=False)
    for (init, gain), ax in zip(itertools.product(inits, gains), axes.flat, strict=True):
        ax.axhspan(low, high, color="green", alpha=0.15, label=f"health band [{low}, {high}]")
        for i, spec in enumerate(probe.policies):
            stds = [results[spec, init, d, gain]["logit_std_after_scale"] for d in probe.head_dims]
            # Some policies coincide at initialisation (learned = inv_sqrt_dk): vary the style.
            style = {"marker": "osv^D"[i % 5], "linestyle": ("-", "--", ":", "-.")[i % 4]}
            style["markerfacecolor"] = "none"
            ax.plot(probe.head_dims, stds, **style, label=spec)
        ax.set(xscale="log", yscale="log", title=f"{init} init, init gain {gain:g}")
        ax.set_xticks(list(probe.head_dims), [str(d) for d in probe.head_dims])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    for ax in axes[-1]:
        ax.set_xlabel("d_k (head_dim)")
    for ax in axes[:, 0]:
        ax.set_ylabel("post-scale logit std at init")
    axes[0, -1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
    """Probe every policy × init × d_k × init gain, write the CSV, markdown and plot (and the
    drift table when probe.drift_store is set); return the rows."""
    probe = config.probe
    dims, gains = tuple(probe.head_dims), tuple(probe.init_gains)
    if not probe.inits or len(set(probe.inits)) < len(probe.inits):
        raise ValueError(f"probe.inits must be distinct model.init values, got {probe.inits}")
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
    for spec, init, d, gain in _grid(probe):
        point = {"policy": spec, "model.init": init, "model.head_dim": d, "model.init_gain": gain}
        results[spec, init, d, gain] = measure(experiment.apply_overrides(config, point), tokens)
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
    if probe.drift_store:
        logit_drift.write(probe.drift_store, workdir)
    return rows
