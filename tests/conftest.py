"""Shared test set-up: make the package importable from a plain checkout (no `pip install -e .`)."""

import atexit
import os
import pathlib
import shutil
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
# The repo root (experiments/) and tests/ itself (tests/helpers.py), whatever pytest's import mode.
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# Tests never talk to the W&B server, whatever the user's login: runs (and the subprocesses the
# tests start, which inherit this environment) write offline run files only.
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"

# One persistent XLA cache for a run of the suite, in each pytest process and the commands its
# tests start (`runtime.enable_compilation_cache` takes JAX's own variable over the cache beside
# a workdir): the tests train the same tiny models again and again, and a program one test
# compiled is loaded by the next (a quarter of the suite's time). Each pytest process (each
# xdist worker) makes its own, empty, so that every run starts cold as CI does and no two
# processes write one entry at once (JAX writes without a lock); removed at exit. A cache the
# user set is theirs and kept. A test of the cache itself removes the variable
# (test_compile_cache.py). Set before JAX is imported: JAX reads these when it is.
_PREFIX = "scale_ablation-tests-xla-cache-"
if os.path.basename(os.environ.get("JAX_COMPILATION_CACHE_DIR", _PREFIX)).startswith(_PREFIX):
    _cache = tempfile.mkdtemp(prefix=_PREFIX)
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


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
