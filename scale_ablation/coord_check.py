r"""The coordinate check: mean |activation| per family against width, under SP and μP.

  python -m scale_ablation.coord_check --config=experiments/mup_transfer.py:cpu \
      --widths=64,128,256,512,1024 --steps=10 --seeds=3 --out=coord_cpu \
      [--parametrizations=sp,mup] [--keep_policy] [--config.train.lr=0.01]

Writes DIR/coord_check.json ({parametrization: {width: {quantity: [step 1..N]}}}, means over
seeds), DIR/<quantity>.png (value against width, one line per step, log-log; one panel per
parametrisation, as mup's `plot_coord_data`) and DIR/verdicts.json (per parametrisation and
quantity the slope of log value against log width at the last step and its verdict, with the
tolerance and each parametrisation's policy), and prints the verdicts. The rules:
`scale_ablation.training.coordinates`. Bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags
from ml_collections import config_flags

from scale_ablation import command_line
from scale_ablation.errors import ConfigError
from scale_ablation.model.parametrization import PARAMETRIZATIONS
from scale_ablation.records import jsonfiles
from scale_ablation.training import coordinates, runtime
from scale_ablation.training import experiment_files as experiment

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment file, path.py[:variant].",
                                          lock_config=False)
_WIDTHS = flags.DEFINE_string("widths", "64,128,256,512,1024", "d_model values, comma-separated.")
_STEPS = flags.DEFINE_integer("steps", 10, "Train steps recorded per width.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds averaged per width.")
_OUT = flags.DEFINE_string("out", None, "Output directory (created).")
_PARAMS = flags.DEFINE_string("parametrizations", "sp,mup", "sp, mup or both.")
_KEEP_POLICY = flags.DEFINE_bool("keep_policy", False,
                                 "Under mup, keep the config's policy (default: mup_inv_dk).")


def parse_args() -> tuple[list[int], list[str]]:
    """(widths, parametrisations), or ConfigError naming the flag."""
    try:
        widths = [int(w) for w in _WIDTHS.value.split(",")]
    except ValueError:
        raise ConfigError(f"--widths must be comma-separated integers, "
                          f"got {_WIDTHS.value!r}") from None
    if len(set(widths)) < 2 or min(widths) < 1:
        raise ConfigError(f"--widths needs two or more distinct positive widths, got {widths}")
    names = [p.strip() for p in _PARAMS.value.split(",") if p.strip()]
    if not names or any(p not in PARAMETRIZATIONS for p in names):
        raise ConfigError(f"--parametrizations must list {' and/or '.join(PARAMETRIZATIONS)}, "
                          f"got {_PARAMS.value!r}")
    if _STEPS.value < 1 or _SEEDS.value < 1:
        raise ConfigError(f"--steps and --seeds must be >= 1, got {_STEPS.value}, {_SEEDS.value}")
    if not _OUT.value or os.path.isfile(_OUT.value):
        raise ConfigError(f"--out must name a directory, got {_OUT.value!r}")
    return sorted(set(widths)), names


def plot(data: coordinates.CoordData, quantity: str, path: str) -> None:
    """Value against width, a line per step, log-log; a panel per parametrisation."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.2 * len(data), 3.4), layout="constrained")
    axes = figure.subplots(1, len(data), sharey=True, squeeze=False)[0]
    for ax, (name, by_width) in zip(axes, data.items(), strict=True):
        widths = sorted(by_width, key=int)
        num_steps = len(by_width[widths[0]][quantity])
        for step in range(num_steps):
            shade = 0.15 + 0.85 * step / max(num_steps - 1, 1)
            ax.plot([int(w) for w in widths], [by_width[w][quantity][step] for w in widths],
                    marker="o", markersize=3, color=(0.1, 0.3 * shade, shade),
                    label=f"step {step + 1}" if step in (0, num_steps - 1) else None)
        ax.set(xscale="log", yscale="log", xlabel="width (d_model)", title=f"{name}: {quantity}")
        ax.set_xticks([int(w) for w in widths], labels=widths, minor=False)
        ax.minorticks_off()
        ax.legend(fontsize=7)
    axes[0].set_ylabel("mean |x|")
    partial = f"{path}.tmp{os.getpid()}"  # a reader, or a kill, sees the old plot or the new
    FigureCanvasAgg(figure).print_png(partial)
    os.replace(partial, path)


def run(config, widths: list[int], names: list[str]) -> dict:
    base = config.model.get("base_d_model", 0) or min(widths)
    configs = {name: {w: coordinates.width_config(config, w, name, base,
                                                  mup_attention=not _KEEP_POLICY.value)
                      for w in widths} for name in names}  # ConfigError before any write
    data = coordinates.coord_data(configs, _STEPS.value, _SEEDS.value)
    os.makedirs(_OUT.value, exist_ok=True)
    jsonfiles.write_text_atomic(os.path.join(_OUT.value, "coord_check.json"),
                                json.dumps(data, indent=1))
    for quantity in coordinates.QUANTITIES:
        plot(data, quantity, os.path.join(_OUT.value, f"{quantity}.png"))
    found = coordinates.verdicts(data)
    summary = {"tolerance": coordinates.SLOPE_TOLERANCE, "base_d_model": base, "widths": widths,
               "steps": _STEPS.value, "seeds": _SEEDS.value, "lr": config.train.lr,
               "policy": {n: configs[n][widths[0]].policy for n in names}, "slopes": found}
    jsonfiles.write_text_atomic(os.path.join(_OUT.value, "verdicts.json"),
                                json.dumps(summary, indent=1))
    return found


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"error: unexpected arguments: {' '.join(argv[1:])}", file=sys.stderr)
        return 2
    if _CONFIG.value is None:
        print("error: --config is required", file=sys.stderr)
        return 2
    runtime.make_experiments_importable(flags.FLAGS["config"].config_filename)
    try:
        experiment.load_module(flags.FLAGS["config"].config_filename)
        widths, names = parse_args()
        found = run(_CONFIG.value, widths, names)
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name, by_quantity in found.items():
        for quantity, result in by_quantity.items():
            print(f"{name:4s} {quantity:14s} slope {result['slope']:+.2f}  {result['verdict']}")
    return 0


if __name__ == "__main__":
    command_line.start(main)
