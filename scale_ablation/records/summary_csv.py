"""A report's rows as summary.csv: one line per run, written and read back with their types."""

from __future__ import annotations

import csv
import math


def write_summary_csv(rows: list[dict], path: str) -> list[str]:
    """Write the rows (the union of their keys as the header, in first-seen order)."""
    header = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return header


def _value(text: str):
    """A CSV cell as the value it was written from: "" is None, numbers are int or float."""
    if text == "":
        return None
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if kind is int or math.isfinite(value) or text.lower() in ("nan", "inf",
                                                                                 "-inf") else text
    return {"True": True, "False": False}.get(text, text)


def read_summary_csv(path: str) -> list[dict]:
    """The rows of a summary.csv, typed back (`_value`); the run name stays a string."""
    with open(path, newline="") as f:
        return [{key: text if key == "name" else _value(text) for key, text in row.items()}
                for row in csv.DictReader(f)]
