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


def pytest_addoption(parser):
    # The conformance suite in test_policies.py runs over `policies.available()`: with this
    # option it covers a user's own policies too, e.g.
    #   python -m pytest tests/test_policies.py --imports=my_policy.py -k my_policy
    parser.addoption("--imports", default="", metavar="MODULE_OR_FILE[,...]",
                     help="scale_ablation: import these (policy modules or .py files) first")


def pytest_configure(config):
    imports = [entry for entry in config.getoption("--imports").split(",") if entry]
    if imports:
        import pytest

        from scale_ablation.model import plugins

        try:
            plugins.load(imports)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
