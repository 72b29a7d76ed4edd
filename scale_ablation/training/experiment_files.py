"""Experiment files: `get_config(arg)` and `sweep(arg)`, big_vision style.

An experiment is a Python file in experiments/ addressed as `path.py[:arg]`. `get_config(arg)`
returns an `ml_collections.ConfigDict`; `sweep(arg)` (optional) returns the grid as a list of
override dicts with dotted keys, e.g. `{"policy": "none", "model.head_dim": 64, "train.seed": 0}`.
"""

from __future__ import annotations

import importlib.util
import pathlib
import traceback
import types
from collections.abc import Sequence
from typing import Any

import ml_collections

Overrides = dict[str, Any]


def load_module(spec: str) -> tuple[types.ModuleType, str | None]:
    """Import the experiment file of `path.py[:arg]`; return the module and the arg."""
    path, _, arg = spec.partition(":")
    file = pathlib.Path(path)
    if not file.is_file():
        raise ValueError(f"experiment file not found: {path}")
    module_spec = importlib.util.spec_from_file_location(f"experiment_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ValueError(f"experiment file {path}:{error.lineno}: syntax error: "
                         f"{error.msg}") from None
    except Exception as error:  # bad input, not a bug of ours: one line, with its place
        raise ValueError(f"experiment file {path} failed to import: "
                         f"{_described(error, file)}") from None
    if not hasattr(module, "get_config"):
        raise ValueError(f"experiment file {path} defines no get_config(arg)")
    return module, (arg or None)


def import_root(spec: str) -> str:
    """The directory above the experiment file's folder. Experiment files import each other
    (`from experiments import base`): entry points put this on sys.path before loading one."""
    return str(pathlib.Path(spec.partition(":")[0]).resolve().parent.parent)


def is_probe(module: types.ModuleType) -> bool:
    """A probe measures without training: it declares `KIND = "probe"` and defines
    `run(config, workdir)`; every other experiment file describes training runs."""
    kind = getattr(module, "KIND", "train")
    if kind not in ("train", "probe"):
        raise ValueError(f"{module.__file__}: KIND must be 'train' or 'probe', got {kind!r}")
    if kind == "probe" and not callable(getattr(module, "run", None)):
        raise ValueError(f"{module.__file__}: a probe must define run(config, workdir)")
    return kind == "probe"


def _described(error: Exception, file: pathlib.Path) -> str:
    """'TYPE: message (at FILE:LINE)', the line being the innermost one in `file`."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if pathlib.Path(frame.filename).resolve() == file.resolve()]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text}{where}"


def _call(module: types.ModuleType, name: str, arg: str | None) -> Any:
    """`module.name(arg)`, with any error but a ValueError (the experiments' way of refusing a
    variant, already one line) as a ValueError naming the file, the call and the line."""
    try:
        return getattr(module, name)(arg)
    except ValueError:
        raise
    except Exception as error:
        raise ValueError(f"experiment file {module.__file__}: {name}({arg!r}) raised "
                         f"{_described(error, pathlib.Path(module.__file__))}") from None


def load_config(spec: str) -> ml_collections.ConfigDict:
    module, arg = load_module(spec)
    config = _call(module, "get_config", arg)
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"experiment file {module.__file__}: get_config({arg!r}) must return "
                         f"an ml_collections.ConfigDict, got {type(config).__name__}")
    return config


def load_grid(spec: str, add_policies: Sequence[str] = ()) -> list[Overrides]:
    """The experiment's grid points; a file without `sweep` is a grid of one empty point.

    `add_policies`: extra policy specs, see `with_policies`."""
    module, arg = load_module(spec)
    grid = _call(module, "sweep", arg) if hasattr(module, "sweep") else [{}]
    if not isinstance(grid, (list, tuple)):
        raise ValueError(f"experiment file {module.__file__}: sweep({arg!r}) must return a "
                         f"list of dicts (one per run), got {type(grid).__name__}")
    for index, point in enumerate(grid):
        if not isinstance(point, dict):
            raise ValueError(f"experiment file {module.__file__}: sweep({arg!r})[{index}] must "
                             f"be a dict of dotted field -> value, got {point!r:.60}")
    return with_policies(list(grid), add_policies)


def with_policies(grid: list[Overrides], specs: Sequence[str]) -> list[Overrides]:
    """`grid` followed by each of `specs` at every setting of the other keys the grid has.

    The d_k sweep with one more policy is `with_policies(dk_grid, ["my_policy"])`: one new point
    per d_k and seed, in the grid's order, its `policy` key where the grid's points have theirs
    (first for a point without one, which ran the config's default policy). A spec the grid
    already has at a setting is not added again there.
    """
    settings: dict[tuple, Overrides] = {}  # the other keys' values -> the first point with them
    present = set()
    for point in grid:
        rest = tuple((key, repr(value)) for key, value in point.items() if key != "policy")
        settings.setdefault(rest, point)
        present.add((rest, point.get("policy")))
    added = []
    for spec in specs:
        for rest, point in settings.items():
            if (rest, spec) in present:
                continue
            present.add((rest, spec))
            if "policy" in point:
                added.append({key: spec if key == "policy" else value
                              for key, value in point.items()})
            else:
                added.append({"policy": spec, **point})
    return [*grid, *added]


def apply_overrides(config: ml_collections.ConfigDict, overrides: Overrides):
    """A copy of `config` with dotted-key overrides applied; an unknown key or a value of the
    wrong type raises ValueError."""
    config = ml_collections.ConfigDict(config.to_dict())
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for depth, part in enumerate([*parents, leaf]):
            # `in` on a leaf value would test membership in it (a substring of a string field).
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                raise ValueError(f"override {key!r}: config has no field {part!r}")
            if depth < len(parents):
                node = node[part]
        try:
            node[leaf] = value
        except TypeError as error:  # ml_collections refuses to change a field's type
            raise ValueError(f"override {key!r}: {error}") from None
    return config


def override_flags(overrides: Overrides) -> list[str]:
    """Command-line flags that reproduce `overrides` with ml_collections.config_flags."""
    return [f"--config.{key}={_flag_value(value)}" for key, value in overrides.items()]


def _flag_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_flag_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def run_name(overrides: Overrides) -> str:
    """A readable, stable directory name for a grid point: `policy=none,head_dim=64,seed=0`."""
    if not overrides:
        return "run"
    parts = []
    for key, value in overrides.items():
        text = str(value).replace("/", "_").replace(" ", "")
        parts.append(f"{key.split('.')[-1]}={text}")
    return ",".join(parts)
