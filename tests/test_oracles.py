"""The tests that compare against an independent implementation (torch, mup, wandb-workspaces,
scipy) skip on a contributor's machine without it and fail under CI (`CI=true`), through one
helper, `helpers.require`, that every such test uses."""

import pathlib
import re
import sys

import helpers
import pytest

TESTS = pathlib.Path(__file__).resolve().parent


@pytest.fixture
def oracle_missing(monkeypatch):
    """mup made unimportable for the test (None in sys.modules halts its import)."""
    monkeypatch.setitem(sys.modules, "mup", None)


def test_a_missing_oracle_skips_locally(oracle_missing, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"mup is missing.*\.\[mup\]"):
        helpers.require("mup")


@pytest.mark.parametrize("value", ["true", "1"])
def test_a_missing_oracle_fails_under_ci(oracle_missing, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=r"CI=true and the oracle mup is missing"):
        helpers.require("mup")


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_present_oracle_is_imported(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    assert helpers.require("scipy.special") is sys.modules["scipy.special"]


def test_no_test_imports_an_oracle_around_the_helper():
    """A plain importorskip of an oracle would skip in CI too, where the oracle must run."""
    oracles = "|".join(helpers.ORACLE_EXTRAS)
    pattern = re.compile(rf"importorskip\(\s*['\"]({oracles})\b")
    offenders = [path.name for path in TESTS.glob("*.py") if pattern.search(path.read_text())]
    assert offenders == []
