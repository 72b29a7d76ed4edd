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
    """The rows of a summary.csv, typed back (`_value`); the run name stays a string.
    ValueError naming the file and line for a row whose cells do not match the header, or a
    file without a `name` column."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = []
        for row in reader:
            if None in row or None in row.values():  # more cells than the header, or fewer
                raise ValueError(f"{path}: line {reader.line_num} has {_cells(row)} cells where "
                                 f"the header has {len(reader.fieldnames or [])}")
            rows.append({key: text if key == "name" else _value(text)
                         for key, text in row.items()})
    if "name" not in (reader.fieldnames or []):
        raise ValueError(f"{path}: not a report's summary.csv (no `name` column)")
    return rows


def _cells(row: dict) -> int:
    """The cells csv.DictReader found on a row: extras are listed under None, missing ones
    are None."""
    return sum(value is not None for key, value in row.items() if key is not None) + len(
        row.get(None) or [])
