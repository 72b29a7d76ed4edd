"""User code that registers scale policies, named on the command line: `--imports=A,B`.

Each entry is a module name (`my_package.policies`, imported from sys.path) or a Python file
(`my_policy.py`, `path/to/policies.py`): importing it runs its `policies.register` calls. Every
entry point (`scale_ablation.main`, `.sweep`, `.report`, `launch/wandb_sweep.py`) defines the flag
with `imports_flag()` and calls `load(...)` first thing in its main function, before any config
or grid is read; `sweeping.sweep_runners.imports_args(...)` passes the same list on to the
processes a sweep starts.

Installed packages need no flag: see `policies.ENTRY_POINT_GROUP`.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
import types
from collections.abc import Sequence

from absl import flags

from scale_ablation.model import policies

HELP = ("Modules or .py files to import before the config is read, comma-separated: their "
        "policies.register calls make new scale policies available.")


def imports_flag() -> flags.FlagHolder:
    """The `--imports` flag, defined on first call: sweep imports report, and both take it."""
    if "imports" not in flags.FLAGS:
        return flags.DEFINE_list("imports", [], HELP)
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS["imports"])


def recorded(imports: Sequence[str]) -> list[str]:
    """`imports` as another process, in another directory, can load them: files by their
    absolute path, modules by name (sweep.json keeps them for a later `report`)."""
    return [str(pathlib.Path(e.strip()).resolve()) if _is_file(e.strip()) else e.strip()
            for e in imports if e.strip()]


def load(imports: Sequence[str]) -> list[types.ModuleType]:
    """Load the installed policy packages, then import each of `imports` in order.

    Raises ValueError with one line naming the entry and what went wrong: a file that does not
    exist, a module that does not import (its own exception, type and message), a policy name
    registered twice.
    """
    policies.available()  # installed packages first: their errors surface here, not mid-run
    modules, seen = [], set()
    for entry in imports:
        entry = entry.strip()
        if not entry or entry in seen:
            continue
        seen.add(entry)
        try:
            modules.append(_import_file(entry) if _is_file(entry) else _import_module(entry))
        except _EntryError as error:
            raise ValueError(f"--imports={entry}: {error}") from None
    return modules


class _EntryError(Exception):
    pass


def _is_file(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def _import_module(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    # Whatever the user's module raises, reported as one line: a KeyboardInterrupt or a
    # sys.exit() in it too, which would otherwise leave with a traceback or a silent exit code.
    except BaseException as error:
        raise _EntryError(_describe(error)) from error


def _import_file(entry: str) -> types.ModuleType:
    path = pathlib.Path(entry).resolve()
    if not path.is_file():
        raise _EntryError("no such file")
    # The file's stem is its module name, so the functions it registers name a module the user
    # recognises (in error messages and in pickled objects).
    name = path.stem
    existing = sys.modules.get(name)
    if existing is not None:
        if pathlib.Path(getattr(existing, "__file__", "") or "").resolve() == path:
            return existing  # imported already, e.g. by another file of the user's
        raise _EntryError(f"a module named {name!r} is already imported "
                            f"(from {getattr(existing, '__file__', None) or 'a built-in'}); "
                            "rename the file")
    # Its own imports of files beside it work, as when Python runs it; appended, so that a file
    # there cannot shadow an installed module.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _EntryError("not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as `import` does: the module may import itself indirectly
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # as in `_import_module`
        del sys.modules[name]
        raise _EntryError(_describe(error)) from error
    return module


def _describe(error: BaseException) -> str:
    """`Type: message (file:line)`, one line. The place is the last frame outside importlib and
    this package: the user's line that raised, or that called `register` with a taken name (a
    SyntaxError's message names its file and line itself)."""
    message = " ".join(str(error).split())
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    if isinstance(error, SyntaxError):
        return text
    skipped = ("<", str(pathlib.Path(__file__).resolve().parents[1]),
               str(pathlib.Path(importlib.__file__).parent))
    place = None
    frame = error.__traceback__
    while frame is not None:
        filename = frame.tb_frame.f_code.co_filename
        if not filename.startswith(skipped):
            place = f"{filename}:{frame.tb_lineno}"
        frame = frame.tb_next
    return f"{text} ({place})" if place else text
