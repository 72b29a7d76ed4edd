r"""Review a sweep: `python -m scale_ablation.report DIR` writes DIR/report/.

summary.csv (one row per run), summary.md (policy × d_k table of final validation bits per byte,
diverged runs marked; the LR-sensitivity of Wortsman et al. 2023 when the sweep varies the
learning rate) and PNG plots. Every number comes from the runs' own metrics.jsonl and
summary.json. The table is also logged as a wandb.Table to a summary run in the sweep's group.
`--imports=my_policy.py` imports user modules first, as the sweep did (`scale_ablation.plugins`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import sys
from collections import defaultdict

from absl import app
from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

from scale_ablation import plugins
from scale_ablation.jsonfiles import read_json
from scale_ablation.run_files import FINISHED, RunFiles
from scale_ablation.wandb_tracker import WandbSettings, WandbTracker


def _layer_mean(row: dict, stat: str) -> float | None:
    """Mean over layers of `attn/layer{i}/{stat}` in one metrics row (None if absent)."""
    values = [v for k, v in row.items()
              if k.startswith("attn/layer") and k.count("/") == 2 and k.endswith("/" + stat)
              and v is not None]
    return statistics.fmean(values) if values else None


def _layer_max(row: dict, stat: str) -> float | None:
    values = [v for k, v in row.items()
              if k.startswith("attn/layer") and k.count("/") == 2 and k.endswith("/" + stat)
              and v is not None]
    return max(values) if values else None


def _series(metrics: list[dict], key_fn) -> list[tuple[int, float]]:
    points = []
    for row in metrics:
        value = key_fn(row)
        if value is not None:
            points.append((row["step"], value))
    return points


def load_runs(sweep_dir: str) -> list[dict]:
    """Each run of the sweep: name, overrides, config, summary and metrics, as on disk."""
    sweep_file = os.path.join(sweep_dir, "sweep.json")
    if os.path.exists(sweep_file):
        with open(sweep_file) as f:
            entries = [(r["name"], r["overrides"]) for r in json.load(f)["runs"]]
    else:
        entries = [(name, {}) for name in sorted(os.listdir(sweep_dir))
                   if os.path.exists(os.path.join(sweep_dir, name, "config.json"))]
    runs = []
    for name, overrides in entries:
        files = RunFiles(os.path.join(sweep_dir, name))
        config = files.read_config()
        if config is None:  # never started
            continue
        runs.append({"name": name, "overrides": overrides, "config": config,
                     "summary": files.read_summary() or {"status": "interrupted"},
                     "metrics": files.read_metrics()})
    return runs


def summarise_run(run: dict) -> dict:
    metrics, summary = run["metrics"], run["summary"]
    diag_rows = [r for r in metrics if _layer_mean(r, "entropy") is not None]
    last_diag = diag_rows[-1] if diag_rows else {}
    max_logits = [v for _, v in _series(metrics, lambda r: _layer_max(r, "max_abs_logit"))]
    last_eval = next((r for r in reversed(metrics) if r.get("val/loss") is not None), {})
    return {
        "name": run["name"],
        "policy": run["config"]["policy"],
        "d_k": run["config"]["model"]["head_dim"],
        "lr": run["config"]["train"]["lr"],
        "seed": run["config"]["train"]["seed"],
        **{f"override:{k}": v for k, v in run["overrides"].items()},
        "status": summary.get("status"),
        "steps_completed": summary.get("steps_completed"),
        "final_val_bpb": summary.get("final_val_bpb"),
        "final_val_loss": summary.get("final_val_loss"),
        "diverged_at_step": summary.get("diverged_at_step"),
        "final_entropy": _layer_mean(last_diag, "entropy"),
        "final_entropy_normalised": _layer_mean(last_diag, "entropy_normalised"),
        "final_max_weight": _layer_mean(last_diag, "max_weight"),
        "final_learned_scale": _layer_mean(last_diag, "learned_scale"),
        "max_attention_logit": max(max_logits) if max_logits else None,
        "initial_val_loss": next((r["val/loss"] for r in metrics
                                  if r.get("step") == 0 and r.get("val/loss") is not None), None),
        # Accuracy (MQAR recall) and the longer evaluation lengths, from the last evaluation.
        **{f"final_{key}": value for key, value in last_eval.items()
           if key.startswith("val/") and key not in ("val/loss", "val/bpb")},
    }


# The table's own axes: every other override of a grid point makes a separate row (a variant),
# so that runs differing in, say, init gain or learning rate are never averaged together.
_TABLE_AXES = ("policy", "model.head_dim", "train.seed")


def _variant(row: dict, also_ignore: tuple[str, ...] = ()) -> str:
    """The policy plus the run's other overrides: `inv_sqrt_dk (init_gain=2.0)`."""
    extras = [f"{key.split('.')[-1]}={value}" for name, value in row.items()
              if name.startswith("override:")
              and (key := name.removeprefix("override:")) not in (*_TABLE_AXES, *also_ignore)]
    return row["policy"] + (f" ({', '.join(extras)})" if extras else "")


def _cell(rows: list[dict], key: str = "final_val_bpb") -> str:
    done = [r[key] for r in rows if r["status"] == "completed" and r.get(key) is not None]
    diverged = [r for r in rows if r["status"] == "diverged"]
    text = ""
    if done:
        text = f"{statistics.fmean(done):.3f}"
        if len(done) > 1:
            text += f" ± {statistics.stdev(done):.3f}"
    if diverged:
        steps = ",".join(str(r["diverged_at_step"]) for r in diverged)
        text += f" (diverged@{steps})" if text else f"diverged@{steps}"
    others = [r["status"] for r in rows if r["status"] not in ("completed", "diverged")]
    if others:
        text += f" [{', '.join(others)}]"
    return text or "—"


def lr_sensitivity(rows: list[dict]) -> dict[str, float]:
    """Wortsman et al. 2023: E_lr[min(loss(lr), loss_init) − min_lr loss(lr)], per variant and
    d_k, from final validation losses (a diverged run counts as loss_init). Each learning rate
    weighs the same: its loss is the mean over its runs (seeds) of min(loss, loss_init)."""
    groups = defaultdict(list)
    for r in rows:
        groups[(_variant(r, also_ignore=("train.lr",)), r["d_k"])].append(r)
    out = {}
    for (variant, d_k), group in groups.items():
        if len({r["lr"] for r in group}) < 2:
            continue
        init = [r["initial_val_loss"] for r in group if r["initial_val_loss"] is not None]
        if not init:
            continue
        loss_init = statistics.fmean(init)
        by_lr = defaultdict(list)
        for r in group:
            finite = (r["status"] == "completed" and r["final_val_loss"] is not None
                      and math.isfinite(r["final_val_loss"]))
            by_lr[r["lr"]].append(min(r["final_val_loss"], loss_init) if finite else loss_init)
        losses = [statistics.fmean(values) for values in by_lr.values()]
        out[f"{variant} d_k={d_k}"] = statistics.fmean(losses) - min(losses)
    return out


def _table(rows: list[dict], key: str, title: str) -> list[str]:
    variants = list(dict.fromkeys(_variant(r) for r in rows))
    head_dims = sorted({r["d_k"] for r in rows})
    lines = [f"# {title}", "",
             "Mean ± std over seeds of completed runs; diverged runs marked with their step.", "",
             "| policy | " + " | ".join(f"d_k={d}" for d in head_dims) + " |",
             "|---|" + "---|" * len(head_dims)]
    for variant in variants:
        cells = [_cell([r for r in rows if _variant(r) == variant and r["d_k"] == d], key)
                 for d in head_dims]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def write_markdown(rows: list[dict], path: str) -> None:
    lines = _table(rows, "final_val_bpb", "Final validation bits per byte")
    # val/loss@N is val/bpb@N times ln 2: one table of the two is enough.
    extra_keys = sorted({k for r in rows for k in r
                         if k.startswith("final_val/") and not k.startswith("final_val/loss@")
                         and r.get(k) is not None})
    for key in extra_keys:  # accuracy, longer evaluation lengths
        lines += ["", *_table(rows, key, f"Final {key.removeprefix('final_')}")]
    sensitivity = lr_sensitivity(rows)
    if sensitivity:
        lines += ["", "## LR sensitivity (Wortsman et al. 2023; lower is more robust)", "",
                  "| policy, d_k | LR sensitivity (nats) |", "|---|---|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in sensitivity.items()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _facets(rows):
    head_dims = sorted({r["d_k"] for r in rows})
    fig = Figure(figsize=(4 * len(head_dims), 3.5))
    axes = fig.subplots(1, len(head_dims), squeeze=False, sharey=True)
    return head_dims, fig, axes[0]


def plot_curves(runs: list[dict], rows: list[dict], key_fn, ylabel: str, path: str) -> None:
    """One panel per d_k, one line per run coloured by policy."""
    head_dims, fig, axes = _facets(rows)
    colours = {p: f"C{i}" for i, p in enumerate(dict.fromkeys(r["policy"] for r in rows))}
    for run, row in zip(runs, rows, strict=True):
        series = _series(run["metrics"], key_fn)
        if series:
            ax = axes[head_dims.index(row["d_k"])]
            ax.plot(*zip(*series, strict=True), color=colours[row["policy"]], alpha=0.8,
                    label=row["policy"])
    for ax, d in zip(axes, head_dims, strict=True):
        ax.set_title(f"d_k = {d}")
        ax.set_xlabel("step")
    axes[0].set_ylabel(ylabel)
    handles = {line.get_label(): line for ax in axes for line in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.88, 1))  # room on the right for the legend
    fig.savefig(path, dpi=110)


def plot_final_vs_dk(rows: list[dict], path: str) -> None:
    fig = Figure(figsize=(5.5, 4))
    ax = fig.subplots()
    for i, variant in enumerate(dict.fromkeys(_variant(r) for r in rows)):
        done = sorted((r["d_k"], r["final_val_bpb"]) for r in rows if _variant(r) == variant
                      and r["status"] == "completed" and r["final_val_bpb"] is not None)
        if done:
            ax.plot(*zip(*done, strict=True), "o-", color=f"C{i}", label=variant)
        diverged = [r["d_k"] for r in rows if _variant(r) == variant and r["status"] == "diverged"]
        if diverged:
            ax.plot(diverged, [ax.get_ylim()[1]] * len(diverged), "x", color=f"C{i}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d_k (head_dim)")
    ax.set_ylabel("final validation bits per byte (x: diverged)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_learned_scale(rows: list[dict], path: str) -> bool:
    learned = [r for r in rows if r["final_learned_scale"] is not None]
    if not learned:
        return False
    fig = Figure(figsize=(5.5, 4))
    ax = fig.subplots()
    for i, policy in enumerate(dict.fromkeys(r["policy"] for r in learned)):
        points = sorted((r["d_k"], r["final_learned_scale"]) for r in learned
                        if r["policy"] == policy)
        ax.plot(*zip(*points, strict=True), "o", color=f"C{i}", label=f"{policy} (final)")
    head_dims = sorted({r["d_k"] for r in rows})
    ax.plot(head_dims, [1 / math.sqrt(d) for d in head_dims], "k--", label="1/√d_k")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("d_k")
    ax.set_ylabel("learned scale (mean over layers)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def write_report(sweep_dir: str) -> str:
    """Write sweep_dir/report/ and return its path."""
    runs = load_runs(sweep_dir)
    if not runs:
        raise ValueError(f"no runs with a config.json under {sweep_dir}")
    rows = [summarise_run(run) for run in runs]
    out = os.path.join(sweep_dir, "report")
    os.makedirs(out, exist_ok=True)
    header = list(dict.fromkeys(key for row in rows for key in row))
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    write_markdown(rows, os.path.join(out, "summary.md"))
    write_incomplete_notice(os.path.join(out, "summary.md"), incomplete_runs(sweep_dir))
    plot_curves(runs, rows, lambda r: r.get("val/loss"), "validation loss (nats/byte)",
                os.path.join(out, "val_loss_curves.png"))
    plot_curves(runs, rows, lambda r: _layer_mean(r, "entropy_normalised"),
                "attention entropy / ln(keys)", os.path.join(out, "entropy_over_training.png"))
    plot_final_vs_dk(rows, os.path.join(out, "final_bpb_vs_dk.png"))
    plot_learned_scale(rows, os.path.join(out, "learned_scale_vs_dk.png"))
    _log_to_wandb(sweep_dir, runs, header, rows)
    return out


def _grid_statuses(sweep_dir: str) -> dict[str, str | None]:
    """Run name -> the status sweep.json recorded (runs never started included), else the
    directories with a config.json (status unknown: None)."""
    grid = read_json(os.path.join(sweep_dir, "sweep.json"))
    if grid is not None:
        return {r["name"]: r.get("status") for r in grid["runs"]}
    return {name: None for name in sorted(os.listdir(sweep_dir))
            if os.path.exists(os.path.join(sweep_dir, name, "config.json"))}


def incomplete_runs(sweep_dir: str) -> list[tuple[str, str]]:
    """(name, status) of the sweep's runs without a result: failed (refused ones included),
    interrupted, preempted, or missing (in the grid, never started)."""
    out = []
    for name, recorded in _grid_statuses(sweep_dir).items():
        files = RunFiles(os.path.join(sweep_dir, name))
        summary = files.read_summary()
        status = (summary or {}).get("status") or (
            recorded if recorded not in (None, "pending") else
            "interrupted" if files.config_path.exists() else "missing")
        if status not in FINISHED:
            out.append((name, status))
    return out


def write_incomplete_notice(path: str, incomplete: list[tuple[str, str]]) -> None:
    """Put the runs without a result at the top of the markdown report: the tables below
    leave them out, and a reader must not take the tables for the whole grid."""
    if not incomplete:
        return
    with open(path, encoding="utf-8") as f:
        body = f.read()
    lines = [f"**{len(incomplete)} run(s) without a result, left out of the tables below:**", ""]
    lines += [f"- {name}: {status}" for name, status in incomplete]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n\n" + body)


def _log_to_wandb(sweep_dir: str, runs: list[dict], header: list[str], rows: list[dict]) -> None:
    settings = WandbSettings.of(
        runs[0]["config"].get("wandb"), job_type="report", tags=(),
        name=f"{os.path.basename(os.path.normpath(sweep_dir))}-report")
    writer = WandbTracker(os.path.join(sweep_dir, "report"),
                          {"sweep_dir": os.path.abspath(sweep_dir)}, settings)
    writer.log_table("summary", header, [[row.get(k) for k in header] for row in rows])
    writer.finish()


_IMPORTS = plugins.imports_flag()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m scale_ablation.report [--imports=MODULE_OR_FILE,...] SWEEP_DIR",
              file=sys.stderr)
        return 2
    if not os.path.isdir(argv[1]):
        print(f"error: no such sweep directory: {argv[1]}", file=sys.stderr)
        return 2
    try:
        plugins.load(_IMPORTS.value)  # the sweep's policies, as its runs had them
        out = write_report(argv[1])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with open(os.path.join(out, "summary.md")) as f:
        print(f.read())
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
