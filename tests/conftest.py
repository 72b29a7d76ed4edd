"""Shared test set-up: make the package importable from a plain checkout (no `pip install -e .`)."""

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
# The repo root (experiments/) and tests/ itself (tests/helpers.py), whatever pytest's import mode.
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# Tests never talk to the W&B server, whatever the user's login: runs (and the subprocesses the
# tests start, which inherit this environment) write offline run files only.
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
