r"""Turn an experiment's grid into a W&B sweep definition (method: grid).

  python launch/wandb_sweep.py --config=experiments/dk_sweep.py:quick --out=sweep.yaml
  wandb sweep sweep.yaml            # prints the sweep id
  wandb agent ENTITY/PROJECT/SWEEP_ID   # from the repo root, on as many machines as you like

Policies of your own: `--imports=my_policy.py` imports the file here (so `--add_policies` and the
grid can name its policies) and puts the same flag in every run's command, so each agent's run
imports it too: give paths relative to the repo root, where agents start, and make the file
reachable there on every machine. `--add_policies=SPEC,...` adds policies to the grid at every
setting of its other keys (`scale_ablation.training.experiment_files.with_policies`).

How a run gets its overrides. The W&B agent replaces a command element that is exactly `${args}`
with one `--NAME=VALUE` per parameter (wandb/sdk/launch/sweeps/utils.py,
create_sweep_command_args; its docs say `--NAME VALUE`, the code writes `--NAME=VALUE`). Naming
the parameters `config.FIELD` therefore hands `scale_ablation.main` the same
`--config.FIELD=VALUE` flags that `scale_ablation.sweep` passes.

- A grid that is exactly the Cartesian product of its keys' values (checked, not assumed) becomes
  one `config.FIELD` parameter per key, so W&B's own grid enumerates it and its UI has a column
  per swept field.
- Any other grid (zipped keys, hand-picked points, mixed key sets) would gain or lose points as a
  product, so it becomes a single parameter `point` whose values are the grid's run names, and
  the command carries a fixed name -> flags table (a shell `case`). The table is frozen into the
  sweep, so editing the experiment file later cannot silently remap a point; an unknown name
  fails the run.

Where a run writes. `scale_ablation.main`'s `--workdir` is one run's directory (config,
metrics, checkpoints, resumption), so runs must not share it. W&B macros cannot build one
per run: only whole-element `${...}` macros are expanded, and `${envvar:NAME}` is resolved once
per agent, before the run id exists. The command therefore runs `bash -c` and the shell builds
the directory: `<workdir>/<run name>` for a `point` sweep (the layout `scale_ablation.sweep`
uses) and `<workdir>/$WANDB_RUN_ID` for a product sweep (the agent sets WANDB_RUN_ID for each
run; `scale_ablation.report <workdir>` reads every run's config.json either way).
"""

from __future__ import annotations

import itertools
import pathlib
import shlex
import sys
from typing import Any

import yaml
from absl import app, flags

from scale_ablation.model import plugins, policies
from scale_ablation.sweeping import sweep_runners
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import runtime

_MAIN = "python -m scale_ablation.main"


def sweep_definition(
    spec: str, workdir: str, *, name: str, project: str | None = None, entity: str | None = None,
    imports: tuple[str, ...] = (), add_policies: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The W&B sweep definition that runs every point of `spec`'s grid (plus `add_policies`)
    exactly once, each run importing `imports` first."""
    for policy_spec in add_policies:  # typed just now: a typo should fail here, not in each run
        policies.get(policy_spec)
    grid = experiment.load_grid(spec, add_policies)
    if not grid:
        raise ValueError(f"{spec}: the grid is empty")
    base = experiment.load_config(spec)
    for point in grid:  # a typo in a key should fail here, not in every W&B run
        experiment.apply_overrides(base, point)
    head = " ".join([_MAIN, f"--config={shlex.quote(spec)}",
                     *map(shlex.quote, sweep_runners.imports_args(imports))])
    parameters = product_parameters(grid)
    if parameters is not None:
        run_dir = f'{shlex.quote(workdir)}/"${{WANDB_RUN_ID:?set by the wandb agent}}"'
        script = f'exec {head} --workdir={run_dir} "$@"'
    else:
        parameters, script = _point_table(grid, head, workdir)
    definition = {"name": name, "method": "grid"}
    definition |= {"project": project} if project else {}
    definition |= {"entity": entity} if entity else {}
    # Unused by the command, but the agent looks `program` up for every run.
    definition["program"] = "scale_ablation/main.py"
    definition["parameters"] = parameters
    # "$0" of `bash -c` is the next element; ${args} become "$@".
    definition["command"] = ["${env}", "bash", "-c", script, "scale_ablation", "${args}"]
    return definition


def product_parameters(grid: list[dict[str, Any]]) -> dict[str, Any] | None:
    """`{"config.KEY": {"values": [...]}}` if `grid` is exactly a Cartesian product, else None."""
    keys = list(grid[0])
    if not keys or any(set(point) != set(keys) for point in grid):
        return None
    values: dict[str, list] = {key: [] for key in keys}
    for point in grid:
        for key in keys:
            if _token(point[key]) not in map(_token, values[key]):
                values[key].append(point[key])
    points = {tuple(_token(point[key]) for key in keys) for point in grid}
    size = 1
    for key in keys:
        size *= len(values[key])
    # Distinct points, all drawn from the per-key values, as many as the product: the product.
    if len(points) != len(grid) or size != len(grid):
        return None
    return {f"config.{key}": {"values": [_wandb_value(v) for v in values[key]]} for key in keys}


def _point_table(grid, head, workdir) -> tuple[dict[str, Any], str]:
    names = [experiment.run_name(point) for point in grid]
    if len(set(names)) != len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"grid points share the run name {duplicate!r}; make the points distinct")
    cases = [
        f"  --point={shlex.quote(name)}) dir={shlex.quote(name)}; set -- "
        + " ".join(map(shlex.quote, experiment.override_flags(point)))
        + " ;;"
        for name, point in zip(names, grid, strict=True)
    ]
    script = "\n".join(
        [
            'case "$1" in',
            *cases,
            '  *) echo "wandb_sweep: unknown point $1" >&2; exit 2 ;;',
            "esac",
            f'exec {head} --workdir={shlex.quote(workdir)}/"$dir" "$@"',
        ]
    )
    return {"point": {"values": names}}, script


def _wandb_value(value: Any) -> Any:
    """Scalars stay typed (W&B's UI sorts and plots them); others become their flag text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return experiment.override_flags({"x": value})[0].split("=", 1)[1]


def _token(value: Any) -> tuple[str, Any]:
    # Type-tagged so that True, 1 and 1.0 stay different values.
    value = _wandb_value(value)
    return type(value).__name__, value


def expand(parameters: dict[str, Any]) -> list[dict[str, Any]]:
    """The points W&B's grid method runs: the Cartesian product of the parameters' values."""
    keys = list(parameters)
    combos = itertools.product(*(parameters[key]["values"] for key in keys))
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


def _default_name(spec: str) -> str:
    path, _, arg = spec.partition(":")
    return pathlib.Path(path).stem + (f"_{arg}" if arg else "")


def _fail(message: str) -> None:
    """Bad input: one line on stderr, exit status 2, nothing written."""
    print(message, file=sys.stderr)
    sys.exit(2)


def _parse(argv: list[str]) -> list[str]:
    # absl's own --help exits 1 and has no -h; answer both with the usage and exit 0.
    if any(arg in ("-h", "--help", "--helpshort") for arg in argv[1:]):
        print(__doc__.strip() + "\n\n" + flags.FLAGS.main_module_help())
        sys.exit(0)
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as error:
        _fail(f"wandb_sweep.py: {error}")
    if len(rest) > 1:
        _fail(f"wandb_sweep.py: unexpected argument {rest[1]!r} (see --help)")
    if not _CONFIG.value:
        _fail("wandb_sweep.py: --config=experiments/X.py[:arg] is required")
    return rest


def main(argv: list[str]) -> None:
    del argv
    spec = _CONFIG.value
    runtime.make_experiments_importable(spec)  # the process edge
    name = _NAME.value or _default_name(spec)
    try:
        plugins.load(_IMPORTS.value)
        definition = sweep_definition(
            spec,
            _WORKDIR.value or f"runs/wandb_{name}",
            name=name,
            project=_PROJECT.value,
            entity=_ENTITY.value,
            imports=tuple(_IMPORTS.value),
            add_policies=tuple(_ADD_POLICIES.value),
        )
    except ValueError as error:
        _fail(f"wandb_sweep.py: {error}")
    text = yaml.safe_dump(definition, sort_keys=False, width=1000)
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    # Flags exist only when this file runs as a script: importing it (the tests do) next to
    # scale_ablation.sweep, which defines --config and --workdir too, must not clash.
    _CONFIG = flags.DEFINE_string("config", None, "Experiment spec, experiments/X.py[:arg].")
    _WORKDIR = flags.DEFINE_string(
        "workdir", None, "Root of the runs' directories (default runs/wandb_<experiment>_<arg>)."
    )
    _OUT = flags.DEFINE_string("out", None, "Write the YAML here instead of to stdout.")
    _PROJECT = flags.DEFINE_string("project", None, "W&B project of the sweep.")
    _ENTITY = flags.DEFINE_string("entity", None, "W&B entity (user or team) of the sweep.")
    _NAME = flags.DEFINE_string("name", None, "Sweep name (default <experiment>_<arg>).")
    _IMPORTS = plugins.imports_flag()
    _ADD_POLICIES = flags.DEFINE_list(
        "add_policies", [], "Policy specs to add to the grid, comma-separated: one more point per "
        "setting of the grid's other keys.")
    app.run(main, flags_parser=_parse)
