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
# Sweeps in the tests run as their flags say, not as a measured table for this machine's CPU
# would arrange them (sweeping/arrangements.py); tests of that choice name their own tables.
os.environ["SCALE_ABLATION_ARRANGEMENTS"] = "off"

# A persistent XLA cache for the suite, kept between runs in .jax_cache/tests (ignored by git):
# the tests build the same tiny models again and again, and about 60% of the time of a test
# that runs JAX in process is compiling (eager operations compile one by one). JAX keys each
# entry by the program, the compile options and the jaxlib version, so an entry is what
# compiling again would give, and a change of code only adds entries. One folder per pytest
# process (each xdist worker, shared with the commands its tests start: they inherit the
# variable, and `runtime.enable_compilation_cache` takes it over the cache beside a workdir),
# since JAX writes an entry without a lock (its lock comes only with its LRU eviction, which
# scans the whole folder at every write: 0.24 s a write at 3,000 entries). Past 2 GiB the
# folder starts again empty. SCALE_ABLATION_TESTS_CACHE=cold starts from an empty cache removed
# at exit (CI's case, a fresh clone, is cold anyway). A cache the user set with
# JAX_COMPILATION_CACHE_DIR is theirs and used as it is. A test of the cache itself removes the
# variable (test_compile_cache.py). Set before JAX is imported: JAX reads these when it is.
_SUITE_CACHE = REPO / ".jax_cache" / "tests"
_SUITE_CACHE_BYTES = 2 << 30
_COLD_PREFIX = "scale_ablation-tests-xla-cache-"


def _folder_bytes(folder: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _suite_cache() -> str:
    """This process's cache folder (see above)."""
    if os.environ.get("SCALE_ABLATION_TESTS_CACHE") == "cold":
        folder = tempfile.mkdtemp(prefix=_COLD_PREFIX)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        return folder
    if not os.environ.get("PYTEST_XDIST_WORKER") and _SUITE_CACHE.is_dir() and \
            _folder_bytes(_SUITE_CACHE) > _SUITE_CACHE_BYTES:
        shutil.rmtree(_SUITE_CACHE, ignore_errors=True)
    folder = _SUITE_CACHE / os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


_user_cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
if not _user_cache or _user_cache.startswith(str(_SUITE_CACHE)) or \
        os.path.basename(_user_cache).startswith(_COLD_PREFIX):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _suite_cache()
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
