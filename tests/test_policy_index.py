"""The list of which module registers which built-in policy (`scale_ablation/model/__init__.py`'s
docstring) against the registry: a policy added, renamed or moved without the list fails here."""

from __future__ import annotations

import re

import pytest

import scale_ablation.model
from scale_ablation.model import policies

PACKAGE = "scale_ablation.model"


def listed() -> dict[str, str]:
    """Policy name -> the module the docstring says registers it (`module: a, b,` lines, their
    names continued on more deeply indented lines)."""
    out, module = {}, None
    for line in scale_ablation.model.__doc__.splitlines():
        if entry := re.fullmatch(r"    (\w+): (.*)", line):
            module, names = entry.groups()
        elif module and (more := re.fullmatch(r"        (\S.*)", line)):
            names = more.group(1)
        else:
            module = None
            continue
        for name in filter(None, (n.strip() for n in names.split(","))):
            assert name not in out, f"{name} listed twice"
            out[name] = f"{PACKAGE}.{module}"
    return out


def registered() -> dict[str, str]:
    """The registry's built-in names (this package's modules: a test's plugin policies left
    out) -> the module that registered each."""
    by = {name: policies.registered_by(name) for name in policies.available()}
    return {name: module for name, module in by.items() if module.startswith(f"{PACKAGE}.")}


def test_the_list_is_the_registry():
    assert listed() == registered()


def test_the_listed_modules_are_the_registry_built_ins():
    assert set(listed().values()) <= {policies.__name__, *policies.BUILTIN_MODULES}


def test_registered_by_names_the_module_and_refuses_an_unknown_name():
    assert policies.registered_by("softcap") == "scale_ablation.model.stabilisers"
    with pytest.raises(KeyError):
        policies.registered_by("no_such_policy")


def test_a_stale_list_is_seen(monkeypatch):
    """The parser reads what the list says: a name dropped from it is a difference."""
    monkeypatch.setattr(scale_ablation.model, "__doc__",
                        scale_ablation.model.__doc__.replace(" sink,", ""))
    assert "sink" not in listed() and "sink" in registered()
