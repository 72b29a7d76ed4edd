"""Shared test set-up: make the package importable from a plain checkout (no `pip install -e .`)."""

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Tests never talk to the W&B server, whatever the user's login: runs (and the subprocesses the
# tests start, which inherit this environment) write offline run files only.
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
