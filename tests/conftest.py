"""Shared test set-up: make the package importable from a plain checkout (no `pip install -e .`)."""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
