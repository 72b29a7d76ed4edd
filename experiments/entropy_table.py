r"""The article's §3 Monte Carlo: softmax entropy of q·k / divisor, no model and no training.

  python -m scale_ablation.main --config=experiments/entropy_table.py --workdir=runs/entropy_table
  python -m scale_ablation.main --config=experiments/entropy_table.py:quick --workdir=runs/entropy_quick

q and `n_keys` keys are drawn i.i.d. from N(0, 1) in d_k dimensions (claim 2). Writes
entropy_table.csv (d_k,divisor,n_keys,entropy,max_weight), entropy_table.md and
entropy_heatmap.png into the workdir. The article prints "typical" numbers: these are measured.
entropy_table.md opens with the command that reproduces it, the machine and the wall time, and
puts every number the article's §3.2 quotes beside the measured cell (`PRINTED`; a quoted cell
whose divisor is not in the grid, such as ÷d_k, is measured on its own with the same draws);
experiments/results/entropy_table/README.md is that file as the probe wrote it.
"""

from __future__ import annotations

import csv
import math
import os
import platform
import shlex
import time

import jax
import ml_collections
import numpy as np

from scale_ablation.model import diagnostics

KIND = "probe"  # measures without training: `scale_ablation.main` calls run()

# Bounds the memory of one draw (chunk × n_keys × d_k floats) on a small machine.
CHUNK = 4096

# The cells the article's §3.2 quotes from its table (the table itself is not in its text; its
# reading of it is): (what the article says, in English, d_k, divisor, the number it prints).
PRINTED = (
    ("÷1: entropy falls from 0.82 …", 16, 1.0, "0.82"),
    ("… to 0.03 as d_k grows", 1024, 1.0, "0.03"),
    *(("÷√d_k: stable at about 1.0", d, math.sqrt(d), "≈ 1.0") for d in (16, 64, 256, 1024)),
    # The same sentence also says ÷d_k tends to uniform attention (entropy ≈ 1.09, weights ≈ 1/3).
    *(("÷d_k: too low (0.01–0.31)", d, float(d), "0.01–0.31") for d in (16, 64, 256, 1024)),
    ("÷10: acceptable at d_k = 16", 16, 10.0, "0.98"),
    ("÷10: falls to 0.72 at d_k = 1024", 1024, 10.0, "0.72"),
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.head_dims = (16, 64, 256, 1024)
    # Each divisor is a number or "sqrtN" (= √N), as in the article's scale_list.
    config.divisors = ("1", "sqrt16", "sqrt64", "sqrt256", "sqrt1024", "10")
    config.n_keys = 3  # keys per query, as in the article
    config.n_samples = 20_000  # queries per cell
    config.seed = 0
    if arg == "quick":
        config.n_samples = 2_000
    elif arg:
        raise ValueError(f"experiments/entropy_table.py: unknown variant {arg!r} (quick)")
    return config


def parse_divisor(spec: str | float) -> tuple[str, float]:
    """(label, value) of a divisor given as a number or "sqrtN"."""
    text = str(spec).strip()
    root = text.startswith("sqrt")
    try:
        number = float(text[4:] if root else text)
    except ValueError:
        number = math.nan
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"divisors: {spec!r} is not a positive number or 'sqrtN'")
    return (f"√{text[4:]}", math.sqrt(number)) if root else (f"{number:g}", number)


def monte_carlo(seed: int, head_dim: int, divisor: float, n_keys: int, n_samples: int):
    """(mean entropy, mean max weight), in chunks; the draws depend on (seed, d_k) only, so
    every divisor of a row sees the same q and keys and a row's differences are the divisor's."""
    rng = jax.random.fold_in(jax.random.key(seed), head_dim)
    # Near-equal chunks: every new array shape costs an eager compile of each op.
    chunk = math.ceil(n_samples / math.ceil(n_samples / CHUNK))
    entropy = max_weight = 0.0
    for index, start in enumerate(range(0, n_samples, chunk)):
        size = min(chunk, n_samples - start)
        draw = dict(head_dim=head_dim, divisor=divisor, n_keys=n_keys, n_samples=size)
        e, m = diagnostics.softmax_entropy_table(jax.random.fold_in(rng, index), **draw)
        entropy, max_weight = entropy + e * size, max_weight + m * size
    return entropy / n_samples, max_weight / n_samples


def command(config: ml_collections.ConfigDict, workdir: str) -> str:
    """The command that reproduces `config`: the variant nearest to it and the fields it changes."""
    given = config.to_dict()
    changes = {}
    for variant in (None, "quick"):
        base = get_config(variant).to_dict()
        changes[variant] = {k: v for k, v in given.items() if base.get(k) != v}
    variant = min(changes, key=lambda v: len(changes[v]))
    spec = "experiments/entropy_table.py" + (f":{variant}" if variant else "")
    overrides = [f"--config.{k}={v!r}" for k, v in changes[variant].items()]
    return shlex.join(["python", "-m", "scale_ablation.main", f"--config={spec}", *overrides,
                       f"--workdir={workdir}"])


def printed_beside_measured(config: ml_collections.ConfigDict, head_dims, values,
                            grids: dict) -> list[str]:
    """A markdown table of the article's quoted cells (`PRINTED`) at this grid's d_k, each beside
    the measured one: from the grid, or measured here (same seed, draws and n) when its divisor
    is not a column."""
    lines = ["| the article says (§3.2) | d_k | divisor | printed entropy | measured entropy "
             "| measured max weight |", "|---|---:|---:|---:|---:|---:|"]
    for said, d_k, divisor, printed in PRINTED:
        if d_k not in head_dims:
            continue
        column = next((j for j, v in enumerate(values) if math.isclose(v, divisor)), None)
        i = head_dims.index(d_k)
        entropy, weight = ((grids["entropy"][i, column], grids["max_weight"][i, column])
                           if column is not None else
                           monte_carlo(config.seed, d_k, divisor, config.n_keys, config.n_samples))
        lines.append(f"| {said} | {d_k} | {divisor:g} | {printed} | {entropy:.3f} | {weight:.3f} |")
    return lines


def markdown(grids: dict, on_diagonal: np.ndarray, head_dims, labels, n_keys: int,
             intro: tuple[str, ...] = ()) -> str:
    def table(values: np.ndarray) -> list[str]:
        columns = " | ".join(f"÷{label}" for label in labels)
        lines = [f"| d_k | {columns} | at ÷√d_k |", "|---:" * (len(labels) + 2) + "|"]
        for d, row, diagonal in zip(head_dims, values, on_diagonal, strict=True):
            cells = [
                f"**{x:.3f}**" if on else f"{x:.3f}" for x, on in zip(row, diagonal, strict=True)
            ]
            at_root = next((c for c, on in zip(cells, diagonal, strict=True) if on), "—")
            lines.append(f"| {d} | {' | '.join(cells)} | {at_root} |")
        return lines

    along = grids["entropy"][on_diagonal]
    spread = f"spans {along.min():.3f}–{along.max():.3f}" if along.size else "is not in this grid"
    uniform = f"Uniform attention has entropy ln({n_keys}) = {math.log(n_keys):.4f}, one-hot 0."
    diagonal = f"Bold cells (last column) have divisor = √d_k; along them the entropy {spread}."
    lines = [*intro, f"## Softmax entropy (nats), {n_keys} keys per query", "", uniform, diagonal,
             ""]
    lines += [*table(grids["entropy"]), "", f"## Mean max weight (uniform: 1/{n_keys}, one-hot: 1)"]
    return "\n".join([*lines, "", *table(grids["max_weight"]), ""])


def heatmap(entropy: np.ndarray, on_diagonal, head_dims, labels, n_keys: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 2, 0.7 * len(head_dims) + 1.5))
    image = ax.imshow(entropy, cmap="viridis", vmin=0.0, vmax=math.log(n_keys), aspect="auto")
    for (i, j), x in np.ndenumerate(entropy):
        color = "white" if x < 0.6 * math.log(n_keys) else "black"
        weight = "bold" if on_diagonal[i, j] else "normal"
        ax.text(j, i, f"{x:.2f}", ha="center", va="center", color=color, fontweight=weight)
    ax.set_xticks(range(len(labels)), [f"÷{label}" for label in labels])
    ax.set_yticks(range(len(head_dims)), [str(d) for d in head_dims])
    ax.set(xlabel="divisor", ylabel="d_k", title="softmax entropy (bold: divisor = √d_k)")
    fig.colorbar(image, ax=ax, label=f"entropy (nats); uniform = ln {n_keys}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def header(config: ml_collections.ConfigDict, workdir: str, timing: tuple[float, float],
           beside: list[str]) -> tuple[str, ...]:
    """The markdown's opening: what this is, how it was made, where, in how long (`timing`:
    seconds of wall time, the 1-minute load average at the start); then the article's printed
    numbers beside the measured ones."""
    seconds, load = timing
    machine = (f"{os.cpu_count()} CPU cores ({platform.machine()}), JAX {jax.__version__} on "
               f"its {jax.default_backend()} backend")
    return (
        "# The article's §3 entropy table, measured", "",
        f"Softmax entropy of q·k / divisor for q and {config.n_keys} keys drawn i.i.d. from "
        f"N(0, 1), {config.n_samples} queries per cell (seed {config.seed}); no model, no "
        "training. Written by experiments/entropy_table.py, not typed:", "",
        f"    {command(config, workdir)}", "",
        f"Measured in {seconds:.0f} s of wall time on {machine}; the load average was "
        f"{load:.1f} when it started.", "",
        "## The article's printed numbers beside the measured ones", "",
        "The article prints its table as \"typical, not exact\" numbers; the cells its text "
        "quotes are these.", "", *beside, "")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, np.ndarray]:
    """Measure every (d_k, divisor) cell; write the CSV, markdown and heatmap; return the grids."""
    head_dims = [int(d) for d in config.head_dims]
    if not head_dims or min(head_dims) < 1 or len(set(head_dims)) < len(head_dims):
        raise ValueError(f"head_dims must be distinct positive integers, got {config.head_dims}")
    if config.n_keys < 2 or config.n_samples < 1:
        raise ValueError(
            f"need n_keys >= 2, n_samples >= 1; got {config.n_keys}, {config.n_samples}"
        )
    labels, values = zip(*(parse_divisor(spec) for spec in config.divisors), strict=True)
    start, load = time.perf_counter(), os.getloadavg()[0]  # the machine may be shared
    grids = {name: np.zeros((len(head_dims), len(values))) for name in ("entropy", "max_weight")}
    for (i, j), _ in np.ndenumerate(grids["entropy"]):
        cell = monte_carlo(config.seed, head_dims[i], values[j], config.n_keys, config.n_samples)
        grids["entropy"][i, j], grids["max_weight"][i, j] = cell
    on_diagonal = np.array([[math.isclose(v, math.sqrt(d)) for v in values] for d in head_dims])
    beside = printed_beside_measured(config, head_dims, values, grids)
    intro = header(config, workdir, (time.perf_counter() - start, load), beside)

    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "entropy_table.csv"), "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["d_k", "divisor", "n_keys", "entropy", "max_weight"])
        for (i, j), entropy in np.ndenumerate(grids["entropy"]):
            max_weight = grids["max_weight"][i, j]
            writer.writerow(
                [
                    head_dims[i],
                    f"{values[j]:.6g}",
                    config.n_keys,
                    f"{entropy:.6f}",
                    f"{max_weight:.6f}",
                ]
            )
    text = markdown(grids, on_diagonal, head_dims, labels, config.n_keys, intro)
    with open(os.path.join(workdir, "entropy_table.md"), "w") as file:
        file.write(text)
    path = os.path.join(workdir, "entropy_heatmap.png")
    heatmap(grids["entropy"], on_diagonal, head_dims, labels, config.n_keys, path)
    print(text)
    return grids
