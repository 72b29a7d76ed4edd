"""JSON for run records: plain Python values from numpy/jax ones, atomic writes, lenient reads."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def plain(value: Any, *, nonfinite_to_none: bool, strict: bool = True) -> Any:
    """Python scalars, lists and str-keyed dicts from numpy/jax values.

    JSON files get `nonfinite_to_none=True`: NaN/Infinity tokens are not JSON and many readers
    reject them, so a diverged loss is written as null. `strict=False` writes other objects
    (a Path in a config) as their str() instead of raising.
    """

    def convert(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, (str, bool, int)) or value is None:
            return value
        if isinstance(value, float):
            return None if nonfinite_to_none and not math.isfinite(value) else value
        if hasattr(value, "__array__"):  # numpy and jax scalars and arrays, without importing jax
            return convert(np.asarray(value).tolist())
        if not strict:
            return str(value)
        raise TypeError(f"cannot log {type(value).__name__} {value!r}: not a number or string")

    return convert(value)


def json_line(value: Any) -> str:
    return json.dumps(plain(value, nonfinite_to_none=True), allow_nan=False)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """A reader (or a crash) sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str | os.PathLike, value: Any, *, sort_keys: bool = True) -> None:
    """Indented JSON, nulls for non-finite numbers; `sort_keys=False` keeps the dicts' order."""
    text = json.dumps(plain(value, nonfinite_to_none=True, strict=False), indent=2,
                      sort_keys=sort_keys, allow_nan=False)
    write_text_atomic(path, text + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """The file's JSON value, or None if there is no file; ValueError naming the file if it
    is not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{os.fspath(path)} is damaged (not JSON: {error}); move it aside "
                         "or repair it") from None


def remove_leftover_temporaries(directory: str | os.PathLike) -> None:
    """Delete `.NAME.tmpPID` files that `write_text_atomic` left behind in a process that died
    (a kill, a full disk) before its rename. Call with the directory's lock held."""
    directory = Path(directory)
    for pattern in (".*.tmp[0-9]*", "*/.*.tmp[0-9]*"):
        for path in directory.glob(pattern):
            if path.name.rpartition(".tmp")[2].isdigit() and path.is_file():
                path.unlink(missing_ok=True)
