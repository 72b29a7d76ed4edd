r"""The variance law's drift over training: 1/√d_k's attention-logit std in runs already made.

  python -m scale_ablation.analysis.logit_drift experiments/results/dk_exponent_cpu/runs.parquet OUT

`experiments/variance_probe.py` measures the law Var(q·k) = d_k·σ_q²·σ_k² at initialisation; this
follows its consequence, the post-scale logit std, through training, from a study store
(`records.study_store`) and without training anything. Per init and d_k (`model.qk_dim`, else
`model.head_dim`), 1/√d_k (`inv_sqrt_dk`) at its best LR (the lowest mean final validation bpb
over seeds among its LRs; a run without one counts as +inf), at every step where all its runs
logged the attention diagnostics: `attn/layer{i}/logit_std` averaged over the layers, and the
ratio of the last such step to step 0 taken seed by seed; mean ± 95% Student-t CI over seeds
(`intervals.mean_ci`). Beside step 0, the law's prediction for unit-variance inputs to q, k
(the attention norm's output at init): σ_q·σ_k = gain² under fan_in, d_model·(0.02·gain)² under
gpt2 (`law_at_init`). Writes logit_drift.md and logit_drift.png into OUT.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections import defaultdict

from scale_ablation.analysis import intervals
from scale_ablation.analysis.intervals import Estimate
from scale_ablation.model import diagnostics
from scale_ablation.model.initializers import GPT2_STD
from scale_ablation.records.study_store import read_store

POLICY = "inv_sqrt_dk"
LAW_TOLERANCE = 0.10  # step 0's mean logit std within ±10% of the law (the probe's LAW_BAND)
LAYER_STD = re.compile(r"^attn/layer(\d+)/logit_std$")


@dataclasses.dataclass(frozen=True)
class Cell:
    """1/√d_k at one (init, d_k), at its best LR: the logit std per logged step over seeds."""

    init: str
    d_k: int
    lr: float
    lr_on_edge: bool  # the best LR is the lowest or the highest of the LRs run
    law: float  # the law's logit std at init for unit-variance inputs (nan: no law for the init)
    stds: dict[int, Estimate]  # step -> mean over layers, mean ± CI over seeds
    ratio: Estimate  # last step / step 0, per seed


def law_at_init(model: dict) -> float:
    """σ_q·σ_k (= the std of q·k/√d_k) when q, k = h·W with unit-variance h: σ_q² = fan_in·σ_W²,
    σ_W = gain/√fan_in (fan_in) or gain·0.02 (gpt2, `initializers.GPT2_STD`)."""
    gain = model["init_gain"]
    if model["init"] == "fan_in":
        return gain**2
    if model["init"] == "gpt2":
        return model["d_model"] * (gain * GPT2_STD) ** 2
    return math.nan


def layer_mean_stds(metrics: list[dict]) -> dict[int, float]:
    """step -> the logit std averaged over layers, at every metrics row that logged it."""
    out = {}
    for row in metrics:
        values = [v for k, v in row.items() if LAYER_STD.match(k) and v is not None]
        if values:
            out[int(row["step"])] = sum(values) / len(values)
    return out


def policy_runs(path: str) -> list[dict]:
    """POLICY's runs in the store at `path`: init, d_k, lr, seed, final bpb, stds by step."""
    rows = []
    for run in read_store(path).runs:
        config = run.config
        if config["policy"] != POLICY:
            continue
        model = config["model"]
        bpb = (run.summary or {}).get("final_val_bpb")
        rows.append({"init": model["init"], "d_k": model.get("qk_dim") or model["head_dim"],
                     "lr": config["train"]["lr"], "seed": config["train"]["seed"],
                     "bpb": math.inf if bpb is None or math.isnan(bpb) else bpb,
                     "law": law_at_init(model), "stds": layer_mean_stds(run.metrics)})
    return rows


def best_lr_runs(rows: list[dict]) -> dict[tuple[str, int], tuple[list[dict], bool]]:
    """(init, d_k) -> (the runs of its LR with the lowest mean final validation bpb, whether
    that LR is the lowest or the highest of its LRs)."""
    by_lr: dict[tuple[str, int], dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_lr[row["init"], row["d_k"]][row["lr"]].append(row)
    out = {}
    for key, lrs in sorted(by_lr.items()):
        best = min(lrs, key=lambda lr: sum(r["bpb"] for r in lrs[lr]) / len(lrs[lr]))
        out[key] = lrs[best], best in (min(lrs), max(lrs))
    return out


def drift(path: str) -> list[Cell]:
    """The drift table: one Cell per (init, d_k), sorted."""
    cells = []
    for (init, d_k), (runs, on_edge) in best_lr_runs(policy_runs(path)).items():
        runs = sorted(runs, key=lambda r: r["seed"])
        steps = sorted(set.intersection(*(set(r["stds"]) for r in runs)))
        if not steps or steps[0] != 0:
            raise ValueError(f"{path}: {init} d_k {d_k} has no logit std at step 0 in every run")
        stds = {s: intervals.mean_ci([r["stds"][s] for r in runs]) for s in steps}
        ratio = intervals.mean_ci([r["stds"][steps[-1]] / r["stds"][0] for r in runs])
        cells.append(Cell(init, d_k, runs[0]["lr"], on_edge, runs[0]["law"], stds, ratio))
    return cells


def _ci(estimate: Estimate) -> str:
    """"mean ± half-width", both to the half-width's second significant digit."""
    if estimate.half_width is None:
        return f"{estimate.mean:.3g}"
    if estimate.half_width == 0:
        return f"{estimate.mean:.3g} ± 0"
    digits = max(0, 1 - math.floor(math.log10(estimate.half_width)))
    return f"{estimate.mean:.{digits}f} ± {estimate.half_width:.{digits}f}"


def findings(cells: list[Cell]) -> list[str]:
    """The table's reading, computed: step 0 against the law, the end against the health band,
    the ratio's range per init."""
    low, high = diagnostics.LOGIT_STD_BAND
    last = list(cells[0].stds)[-1]
    at_law = [c for c in cells if abs(c.stds[0].mean / c.law - 1) <= LAW_TOLERANCE]
    in_band = [c for c in cells if low <= c.stds[last].mean <= high]
    lines = [f"- Step 0: the mean logit std is within ±{LAW_TOLERANCE:.0%} of the law at init in "
             f"{len(at_law)} of {len(cells)} cells.",
             f"- Step {last}: the mean logit std is inside the health band [{low}, {high}] in "
             f"{len(in_band)} of {len(cells)} cells."]
    for init in dict.fromkeys(c.init for c in cells):
        ratios = [c.ratio.mean for c in cells if c.init == init]
        ends = [c.stds[last].mean for c in cells if c.init == init]
        lines.append(f"- {init}: step {last} / step 0 from {min(ratios):.3g} to {max(ratios):.3g}"
                     f" (mean over seeds); step {last} std from {min(ends):.3g} to {max(ends):.3g}.")
    return lines


def markdown(cells: list[Cell], source: str) -> str:
    steps = list(cells[0].stds)
    last = steps[-1]
    lines = [
        "## Logit std over training: 1/√d_k at its best LR",
        "",
        f"From `{source}` (no new training). Logit std: `attn/layer{{i}}/logit_std` (root mean "
        "square over heads of the post-scale logits' std), averaged over layers; cells are mean ± "
        "95% Student-t CI half-width over seeds, n seeds. The ratio is step "
        f"{last} / step 0, taken per seed. (edge): the best LR is the lowest or highest run, so "
        "the LR may not be located. Law at init: σ_q·σ_k for unit-variance inputs "
        "(gain² under fan_in, d_model·(0.02·gain)² under gpt2).",
        "",
        "| init | d_k | best LR | n | law at init | "
        + " | ".join(f"step {s}" for s in steps) + f" | step {last} / step 0 |",
        "|---|---:|---:|---:|---:|" + "---:|" * (len(steps) + 1),
    ]
    for c in cells:
        values = " | ".join(_ci(c.stds[s]) for s in steps)
        lr = f"{c.lr:g}{' (edge)' if c.lr_on_edge else ''}"
        lines.append(f"| {c.init} | {c.d_k} | {lr} | {c.ratio.n} | {c.law:.3g} | {values} "
                     f"| {_ci(c.ratio)} |")
    return "\n".join([*lines, "", *findings(cells), ""])


def plot(cells: list[Cell], path: str) -> None:
    """Logit std at step 0 and at the last step against d_k, one colour per init, log axes."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    low, high = diagnostics.LOGIT_STD_BAND
    ax.axhspan(low, high, color="green", alpha=0.12, label=f"health band [{low}, {high}]")
    last = list(cells[0].stds)[-1]
    inits = list(dict.fromkeys(c.init for c in cells))
    for i, init in enumerate(inits):
        mine = [c for c in cells if c.init == init]
        # A small sideways shift per init keeps the error bars of the two inits apart.
        dims = [c.d_k * 1.04 ** (i - (len(inits) - 1) / 2) for c in mine]
        ax.plot(dims, [c.law for c in mine], color=f"C{i}", linewidth=7, alpha=0.25,
                solid_capstyle="butt", label=f"{init}, law at init")
        for step, style in ((0, {"linestyle": "--", "markerfacecolor": "none"}), (last, {})):
            means = [c.stds[step].mean for c in mine]
            errors = [c.stds[step].half_width or 0.0 for c in mine]
            ax.errorbar(dims, means, yerr=errors, color=f"C{i}", marker="o", capsize=3,
                        label=f"{init}, step {step}", **style)
    ax.set(xscale="log", yscale="log", xlabel="d_k (q/k width per head)",
           ylabel="logit std after 1/√d_k (mean over layers)",
           title=f"1/√d_k at its best LR: step 0 (dashed) and step {last} (solid)")
    dims = sorted({c.d_k for c in cells})
    ax.set_xticks(dims, [str(d) for d in dims])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5),
              title="bars: 95% CI over seeds", title_fontsize=8)
    fig.savefig(path, dpi=120)


def write(path: str, outdir: str) -> list[Cell]:
    """The drift table from the store at `path`: logit_drift.md and .png into `outdir`."""
    cells = drift(path)
    if not cells:
        raise ValueError(f"{path} holds no {POLICY} runs")
    os.makedirs(outdir, exist_ok=True)
    text = markdown(cells, path)
    with open(os.path.join(outdir, "logit_drift.md"), "w") as file:
        file.write(text)
    plot(cells, os.path.join(outdir, "logit_drift.png"))
    print(text)
    return cells


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    write(sys.argv[1], sys.argv[2])
