"""Every command's command line: absl's parsing, with bad input as one line and exit 2.

absl itself prints two lines and exits 1 for a bad flag, prints the module's docstring for an
extra argument, and ml_collections raises AttributeError or KeyError, with a traceback, for an
override of a field the config lacks. `start(main, positionals=...)` runs a command's `main`
with all of that turned into one `error: ...` line and exit 2 before `main` is called, so
before anything is written. A command's own checks of flag values go in `validate`, run after
parsing (flag values that each make sense alone but not together, or that absl's types accept
and the command cannot use).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags

from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import runtime


def fail(message: str) -> NoReturn:
    """The one line of bad input, and exit 2."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def start(main: Callable[[list[str]], int], *, positionals: int | tuple[int, int] = 0,
          usage: str = "", validate: Callable[[], None] | None = None) -> None:
    """`app.run(main)` with this module's parsing. `positionals`: how many arguments the command
    takes after its flags (a count, or (fewest, most)); `usage` is the line shown when the
    count is wrong. `validate` raises ValueError naming the flag whose value is bad."""
    def parse(argv: list[str]) -> list[str]:
        rest = parse_flags(argv)
        fewest, most = positionals if isinstance(positionals, tuple) else (positionals,) * 2
        if len(rest) - 1 > most:
            fail(f"unexpected arguments: {' '.join(rest[most + 1:])}"
                 + (f" (usage: {usage})" if usage else ""))
        if len(rest) - 1 < fewest:
            fail(f"usage: {usage}")
        if validate is not None:
            try:
                validate()
            except ValueError as error:
                fail(str(error))
        return rest

    app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with bad flags reported like other bad input: one line, exit 2.

    The experiment file of a `--config=` is loaded first, here: config_flags lets its import
    errors and get_config's escape raw.
    """
    _check_experiment_file(argv)
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        lines = str(error).strip().splitlines()
        # A ValueError from get_config (an unknown variant) arrives wrapped with its traceback;
        # any other exception there is a bug in the experiment file: keep the traceback.
        if len(lines) > 1 and not lines[-1].startswith("ValueError: "):
            raise
        message = lines[-1].removeprefix("ValueError: ") if lines else type(error).__name__
        if "Unknown command line flag 'config." in message:
            message += ("; this command takes no config overrides (set the fields in the "
                        "experiment file)")
    except (AttributeError, KeyError) as error:
        message = _unknown_field(argv, error)
    except OSError as error:
        # config_flags defers a missing experiment file's error to the config's first use,
        # which an override is.
        if "earlier failure to load" not in str(error):
            raise
        message = f"cannot load the experiment file: {str(error).strip().splitlines()[-1].strip()}"
    fail(message)


def _unknown_field(argv: list[str], error: AttributeError | KeyError) -> str:
    """ml_collections' [AttributeError(]KeyError("'name'\\nDid you mean ...?")[)] for a
    `--config.FIELD` the config lacks, as one line naming the flag; re-raised when no override
    names the field (a bug, not bad input)."""
    key_error = error if isinstance(error, KeyError) else (error.args or [None])[0]
    text = key_error.args[0] if isinstance(key_error, KeyError) and key_error.args else ""
    name, *hint = str(text).splitlines() or [""]
    name = name.strip("'\"")
    overrides = [arg.split("=")[0] for arg in argv[1:] if arg.startswith("--config.")]
    named = [flag for flag in overrides if name in flag.split(".")]
    if not named:
        raise error
    return f"{named[0]}: the config has no field {name!r}. {' '.join(hint)}".strip()


def _check_experiment_file(argv: list[str]) -> None:
    """One line and exit 2 for an experiment file that fails to import, or whose get_config
    raises or returns no ConfigDict (`experiment_files.load_config`)."""
    specs = [arg.split("=", 1)[1] for arg in argv[1:] if arg.startswith("--config=")]
    if not specs:
        return
    runtime.make_experiments_importable(specs[-1])
    try:
        experiment.load_config(specs[-1])
    except ValueError as error:
        fail(str(error))
