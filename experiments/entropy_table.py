r"""The article's §3 Monte Carlo: softmax entropy of q·k / divisor, no model and no training.

  python -m scale_ablation.main --config=experiments/entropy_table.py --workdir=runs/entropy_table
  python -m scale_ablation.main --config=experiments/entropy_table.py:quick --workdir=runs/entropy_quick

q and `n_keys` keys are drawn i.i.d. from N(0, 1) in d_k dimensions (claim 2). Writes
entropy_table.csv (d_k,divisor,n_keys,entropy,max_weight), entropy_table.md and
entropy_heatmap.png into the workdir. The article prints "typical" numbers: these are measured.
"""

from __future__ import annotations

import csv
import math
import os

import jax
import ml_collections
import numpy as np

from scale_ablation import diagnostics

# Bounds the memory of one draw (chunk × n_keys × d_k floats) on a small machine.
CHUNK = 4096


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.head_dims = (16, 64, 256, 1024)
    # Each divisor is a number or "sqrtN" (= √N), as in the article's scale_list.
    config.divisors = ("1", "sqrt16", "sqrt64", "sqrt256", "sqrt1024", "10")
    config.n_keys = 3  # keys per query, as in the article
    config.n_samples = 20_000  # queries per cell
    config.seed = 0
    # main.py reads train.compilation_cache for every experiment; this one compiles nothing big.
    config.train = ml_collections.ConfigDict({"compilation_cache": False})
    if arg == "quick":
        config.n_samples = 2_000
    elif arg:
        raise ValueError(f"experiments/entropy_table.py: unknown variant {arg!r} (quick)")
    return config


def parse_divisor(spec: str | float) -> tuple[str, float]:
    """(label, value) of a divisor given as a number or "sqrtN"."""
    text = str(spec).strip()
    try:
        if text.startswith("sqrt"):
            label, value = f"√{text[4:]}", math.sqrt(float(text[4:]))
        else:
            label, value = f"{float(text):g}", float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"divisors: {spec!r} is not a positive number or 'sqrtN'")
    return label, value


def monte_carlo(seed: int, head_dim: int, divisor: float, n_keys: int, n_samples: int):
    """(mean entropy, mean max weight), in chunks; the draws depend on (seed, d_k) only, so
    every divisor of a row sees the same q and keys and a row's differences are the divisor's."""
    rng = jax.random.fold_in(jax.random.key(seed), head_dim)
    entropy = max_weight = 0.0
    for index, start in enumerate(range(0, n_samples, CHUNK)):
        size = min(CHUNK, n_samples - start)
        e, m = diagnostics.softmax_entropy_table(
            jax.random.fold_in(rng, index), head_dim=head_dim, divisor=divisor, n_keys=n_keys,
            n_samples=size,
        )
        entropy, max_weight = entropy + e * size, max_weight + m * size
    return entropy / n_samples, max_weight / n_samples


def markdown(rows: list[dict], head_dims, divisors, n_keys: int) -> str:
    def table(field: str) -> list[str]:
        lines = ["| d_k | " + " | ".join(f"÷{label}" for label, _ in divisors) + " | at ÷√d_k |",
                 "|---:" * (len(divisors) + 2) + "|"]
        for d in head_dims:
            cells, diagonal = [], "—"
            for label, value in divisors:
                text = f"{next(r[field] for r in rows if r['d_k'] == d and r['label'] == label):.3f}"
                if math.isclose(value, math.sqrt(d)):
                    text = diagonal = f"**{text}**"
                cells.append(text)
            lines.append(f"| {d} | " + " | ".join(cells) + f" | {diagonal} |")
        return lines

    on_diagonal = [r["entropy"] for r in rows if math.isclose(r["divisor"], math.sqrt(r["d_k"]))]
    spread = (f"Along the diagonal the entropy spans {min(on_diagonal):.3f}–{max(on_diagonal):.3f}."
              if on_diagonal else "No divisor in this grid equals √d_k for any d_k.")
    return "\n".join([
        f"## Softmax entropy (nats), {n_keys} keys per query",
        "",
        f"Uniform attention has entropy ln({n_keys}) = {math.log(n_keys):.4f}; one-hot has 0. "
        f"Bold cells (and the last column) are divisor = √d_k. {spread}",
        "",
        *table("entropy"),
        "",
        f"## Mean max weight (uniform: 1/{n_keys} = {1 / n_keys:.4f}; one-hot: 1)",
        "",
        *table("max_weight"),
        "",
    ])


def heatmap(rows: list[dict], head_dims, divisors, n_keys: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.array([[r["entropy"] for r in rows if r["d_k"] == d] for d in head_dims])
    fig, ax = plt.subplots(figsize=(1.2 * len(divisors) + 2, 0.7 * len(head_dims) + 1.5))
    image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=math.log(n_keys), aspect="auto")
    for i, d in enumerate(head_dims):
        for j, (_, value) in enumerate(divisors):
            weight = "bold" if math.isclose(value, math.sqrt(d)) else "normal"
            ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontweight=weight,
                    color="white" if grid[i, j] < 0.6 * math.log(n_keys) else "black")
    ax.set_xticks(range(len(divisors)), [f"÷{label}" for label, _ in divisors])
    ax.set_yticks(range(len(head_dims)), [str(d) for d in head_dims])
    ax.set_xlabel("divisor")
    ax.set_ylabel("d_k")
    ax.set_title(f"softmax entropy, {n_keys} keys (bold: divisor = √d_k)")
    fig.colorbar(image, ax=ax, label=f"entropy (nats), max ln {n_keys}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
    """Measure every (d_k, divisor) cell and write the CSV, markdown and heatmap."""
    head_dims = [int(d) for d in config.head_dims]
    if not head_dims or min(head_dims) < 1:
        raise ValueError(f"head_dims must be positive integers, got {tuple(config.head_dims)}")
    if config.n_keys < 2 or config.n_samples < 1:
        raise ValueError(f"need n_keys >= 2 and n_samples >= 1, got {config.n_keys}, "
                         f"{config.n_samples}")
    divisors = [parse_divisor(spec) for spec in config.divisors]
    rows = []
    for d in head_dims:
        for label, value in divisors:
            entropy, max_weight = monte_carlo(config.seed, d, value, config.n_keys,
                                              config.n_samples)
            rows.append({"d_k": d, "divisor": value, "label": label, "n_keys": config.n_keys,
                         "entropy": entropy, "max_weight": max_weight})
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "entropy_table.csv"), "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["d_k", "divisor", "n_keys", "entropy", "max_weight"])
        for r in rows:
            writer.writerow([r["d_k"], f"{r['divisor']:.6g}", r["n_keys"], f"{r['entropy']:.6f}",
                             f"{r['max_weight']:.6f}"])
    text = markdown(rows, head_dims, divisors, config.n_keys)
    with open(os.path.join(workdir, "entropy_table.md"), "w") as file:
        file.write(text)
    heatmap(rows, head_dims, divisors, config.n_keys, os.path.join(workdir, "entropy_heatmap.png"))
    print(text)
    return rows
