r"""The coordinate check: mean |activation| per family against a scaled axis, per arm.

  python -m scale_ablation.coord_check --config=experiments/mup_transfer.py:cpu \
      --widths=64,128,256,512,1024 --steps=10 --seeds=3 --out=coord_cpu \
      [--axis=width|head_dim|qk_dim|num_layers] [--parametrizations=sp,mup,mup:inv_sqrt_dk] \
      [--keep_policy] [--config.train.lr=0.01]

`--widths` are the sizes along `--axis`: d_model (`width`, the default), the head dim of q/k/v
(`head_dim`) or of q/k alone (`qk_dim`) at the config's d_model and heads, or the depth
(`num_layers`, CompleteP's base the smallest). An arm is `PARAMETRIZATION[@ALPHA][:POLICY]`
(`sp@0.5`: model.depth_alpha 0.5); a bare `mup` takes μP's `mup_inv_dk:<base d_k>`, a bare
`umup` u-μP's `inv_dk` (the config's policy with `--keep_policy`), a bare `sp` the config's. Writes DIR/coord_check.json ({arm:
{size: {quantity: [step 1..N]}}}, means over seeds), DIR/<quantity>.png (value against size,
one line per step, log-log; one panel per arm, as mup's `plot_coord_data`) and
DIR/verdicts.json (per arm and quantity the slope of log value against log size at the last
step and its verdict, with the tolerance, the axis, its base and each arm's policy), and prints
the verdicts. The rules: `scale_ablation.training.coordinates`. Bad input: one line, exit 2,
nothing written.
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
_WIDTHS = flags.DEFINE_string("widths", "64,128,256,512,1024",
                               "Sizes along --axis (d_model, or a head dim), comma-separated.")
_AXIS = flags.DEFINE_enum("axis", "width", coordinates.AXES,
                          "The scaled axis: d_model, q/k/v's head dim, q/k's alone, or depth.")
_STEPS = flags.DEFINE_integer("steps", 10, "Train steps recorded per width.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds averaged per width.")
_OUT = flags.DEFINE_string("out", None, "Output directory (created).")
_PARAMS = flags.DEFINE_string("parametrizations", "sp,mup",
                               "Arms, PARAMETRIZATION[@ALPHA][:POLICY] (sp, mup or umup; ALPHA: "
                               "model.depth_alpha), comma-separated.")
_KEEP_POLICY = flags.DEFINE_bool("keep_policy", False,
                                 "Under mup or umup, keep the config's policy (default: "
                                 "mup_inv_dk, inv_dk).")


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
    if not names or any(coordinates.split_arm(p)[0] not in PARAMETRIZATIONS for p in names):
        raise ConfigError(f"--parametrizations must list arms of {' or '.join(PARAMETRIZATIONS)}"
                          f" (each PARAMETRIZATION[@ALPHA][:POLICY]), got {_PARAMS.value!r}")
    if _STEPS.value < 1 or _SEEDS.value < 1:
        raise ConfigError(f"--steps and --seeds must be >= 1, got {_STEPS.value}, {_SEEDS.value}")
    if not _OUT.value or os.path.isfile(_OUT.value):
        raise ConfigError(f"--out must name a directory, got {_OUT.value!r}")
    return sorted(set(widths)), names


AXIS_LABELS = {"width": "width (d_model)", "head_dim": "head dim (q, k, v)",
               "qk_dim": "q/k dim per head (d_k)", "num_layers": "depth (layers L)"}


def arm_title(name: str) -> str:
    """A panel's name for an arm: "sp@0.5" -> "sp, α = 0.5" (CompleteP's α)."""
    parametrization, policy, alpha = coordinates.split_arm(name)
    return ", ".join([parametrization, *([f"α = {alpha:g}"] if alpha else []),
                      *([policy] if policy else [])])


def plot(data: coordinates.CoordData, quantity: str, path: str, axis: str = "width") -> None:
    """Value against size, a line per step, log-log; a panel per arm."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

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
        ax.set(xscale="log", yscale="log", xlabel=AXIS_LABELS[axis],
               title=f"{arm_title(name)}: {quantity}")
        ax.set_xticks([int(w) for w in widths], labels=widths, minor=False)
        ax.minorticks_off()
        # 1-2-5 ticks with plain labels: a range inside one decade still reads off the axis.
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    # One legend, beside the last panel, where it covers no line.
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    axes[0].set_ylabel("mean |x|")
    partial = f"{path}.tmp{os.getpid()}"  # a reader, or a kill, sees the old plot or the new
    FigureCanvasAgg(figure).print_png(partial)
    os.replace(partial, path)


def base_size(config, sizes: list[int]) -> int:
    """μP's base along the axis: the config's base_d_model for the width (else the smallest
    width), the smallest size along a head dim or the depth."""
    if _AXIS.value == "width":
        return config.model.get("base_d_model", 0) or min(sizes)
    return min(sizes)


def run(config, widths: list[int], names: list[str]) -> dict:
    axis, base = _AXIS.value, base_size(config, widths)
    configs = {name: {w: coordinates.axis_config(config, axis, w, name, base,
                                                 mup_attention=not _KEEP_POLICY.value)
                      for w in widths} for name in names}  # ConfigError before any write
    data = coordinates.coord_data(configs, _STEPS.value, _SEEDS.value)
    os.makedirs(_OUT.value, exist_ok=True)
    jsonfiles.write_text_atomic(os.path.join(_OUT.value, "coord_check.json"),
                                json.dumps(data, indent=1))
    for quantity in coordinates.QUANTITIES:
        plot(data, quantity, os.path.join(_OUT.value, f"{quantity}.png"), axis)
    found = coordinates.verdicts(data)
    summary = {"tolerance": coordinates.SLOPE_TOLERANCE, "axis": axis, "base": base,
               **({"base_d_model": base} if axis == "width" else {}), "widths": widths,
               "steps": _STEPS.value, "seeds": _SEEDS.value, "lr": config.train.lr,
               "policy": {n: configs[n][widths[0]].policy for n in names},
               **({"depth_alpha": {n: configs[n][widths[0]].model.depth_alpha for n in names}}
                  if axis == "num_layers" else {}), "slopes": found}
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
            print(f"{name:16s} {quantity:14s} slope {result['slope']:+.2f}  {result['verdict']}")
    return 0


if __name__ == "__main__":
    command_line.start(main)
