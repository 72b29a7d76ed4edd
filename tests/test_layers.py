"""The package's shape, checked from its source: every import points down the layers, no cycles,
no module over 400 lines, no function over 60.

The layers, bottom to top (a module may import its own layer and those below it):

    errors → data | model → records → analysis → training → sweeping → commands

`data` and `model` are independent of each other. The commands are the modules directly in
`scale_ablation/` besides `errors.py`. Imports inside functions count: a lazy import is still an
arrow; imports under `if TYPE_CHECKING:` do not (they exist for annotations only). Only `scale_ablation.*` imports are read; the test parses the files, so it sees what the
code says rather than what happened to be imported.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "scale_ablation"
LAYERS = {"errors": 0, "data": 1, "model": 1, "records": 2, "analysis": 3, "training": 4,
          "sweeping": 5}
COMMANDS = 6
INDEPENDENT = {frozenset({"data", "model"})}  # same rank, no arrow either way
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def group(module: str) -> str:
    """The layer name of a dotted module: its subpackage, `errors`, or `commands`."""
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    return parts[1] if parts[1] in LAYERS else "commands"


def rank(module: str) -> int:
    return LAYERS.get(group(module), COMMANDS)


def imported(path: pathlib.Path, module: str) -> set[str]:
    """The `scale_ablation` modules `path` imports (`from scale_ablation.x import y` counts as
    `scale_ablation.x.y` when that is a module, else `scale_ablation.x`)."""
    known = modules()
    out = set()
    tree = ast.parse(path.read_text())
    type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in type_only:  # `if TYPE_CHECKING:` imports: annotations, not arrows
            continue
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name.startswith("scale_ablation")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.startswith("scale_ablation"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
    out.discard(module)
    return out


def graph() -> dict[str, set[str]]:
    return {name: imported(path, name) for name, path in modules().items()}


def test_the_layer_table_names_every_subpackage():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"errors"}


def test_every_import_points_down_the_layers():
    upward = []
    for module, targets in graph().items():
        for target in targets:
            same_rank_apart = frozenset({group(module), group(target)}) in INDEPENDENT
            if rank(target) > rank(module) or same_rank_apart:
                upward.append(f"{module} imports {target}")
    assert upward == []


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*path, node, target]
            if target not in state and (cycle := visit(target, [*path, node])):
                return cycle
        state[node] = 2
        return None

    cycles = [cycle for node in sorted(edges) if node not in state
              and (cycle := visit(node, []))]
    assert cycles == []


@pytest.mark.parametrize("module", sorted(modules()))
def test_modules_and_functions_stay_short(module):
    path = modules()[module]
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path.name}: {text.count(chr(10))} lines"
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_the_checker_sees_an_upward_import(tmp_path):
    """The graph is read from source: a model module importing training is an upward arrow."""
    fake = tmp_path / "bad.py"
    fake.write_text("def f():\n    from scale_ablation.training import loop\n")
    targets = imported(fake, "scale_ablation.model.bad")
    assert targets == {"scale_ablation.training.loop"}
    assert rank("scale_ablation.training.loop") > rank("scale_ablation.model.bad")
