"""The config schema (`training.schema`): every field declared, invalid values refused in one line
naming the field before anything is written, valid ones accepted (Hypothesis, issue 34)."""

from __future__ import annotations

import importlib
import math

import ml_collections
import pytest
from helpers import OWN_CACHE, REPO, snapshot, tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_train_faults import main_args, one_error_line, run_module

from experiments import base
from scale_ablation.errors import ConfigError
from scale_ablation.training import run_setup, schema
from scale_ablation.training.run_config import validate

TRAINING_EXPERIMENTS = sorted(
    path.stem for path in (REPO / "experiments").glob("*.py")
    if path.stem not in ("__init__", "base")
    and not hasattr(importlib.import_module(f"experiments.{path.stem}"), "run"))  # not probes
SETTINGS = settings(max_examples=5, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much])
BIG = 1 << 20  # the largest value drawn for an unbounded field


def configs_to_cover() -> dict[str, dict]:
    out = {f"base.py:{v}": base.get_config(v).to_dict() for v in (None, *base.VARIANTS)}
    for name in TRAINING_EXPERIMENTS:
        module = importlib.import_module(f"experiments.{name}")
        for variant in (None, *getattr(module, "VARIANTS", ())):
            try:
                out[f"{name}.py:{variant}"] = module.get_config(variant).to_dict()
            except ValueError:  # a variant the experiment has not sized
                continue
    return out


def test_every_config_field_has_a_schema_entry():
    missing = {}
    for where, config in configs_to_cover().items():
        for name in schema.leaf_names(config):
            if name not in schema.BY_NAME:
                missing.setdefault(name, where)
    assert not missing, ("config fields without an entry in scale_ablation/training/schema.py "
                         "FIELDS (declare each one's kind, range and meaning): "
                         + ", ".join(f"{name} (in {where})" for name, where in missing.items()))


def test_every_schema_entry_is_a_field_of_the_base_config_or_marked_optional():
    names = set(schema.leaf_names(base.get_config().to_dict()))
    stale = [f.name for f in schema.FIELDS if f.name not in names and not f.optional]
    assert not stale, f"schema entries for fields base.py does not have: {stale}"


def test_the_shipped_configs_pass_the_schema():
    for where, config in configs_to_cover().items():
        try:
            schema.check(config)
        except ConfigError as error:
            pytest.fail(f"{where}: {error}")


# ------------------------------------------------ values from the declarations


def _bound(field: schema.Field, config: dict) -> tuple[float | None, float | None]:
    return field.bounds(config)


def invalid_values(field: schema.Field, config: dict) -> st.SearchStrategy:
    """Values outside `field`'s declaration: the wrong type, or outside its range or choices."""
    wrong_type = {"int": st.one_of(st.text(max_size=3), st.booleans(),
                                   st.floats(allow_nan=False).filter(lambda v: v != int(v)
                                                                     if math.isfinite(v)
                                                                     else True)),
                  "float": st.one_of(st.text(max_size=3), st.booleans(),
                                     st.sampled_from([math.nan, math.inf, -math.inf])),
                  "str": st.one_of(st.integers(), st.floats(allow_nan=False)),
                  "bool": st.one_of(st.integers(), st.text(max_size=3)),
                  "ints": st.one_of(st.integers(), st.lists(st.text(max_size=2), min_size=1)),
                  "strs": st.one_of(st.integers(), st.lists(st.integers(), min_size=1))}
    options = [wrong_type[field.kind]]
    low, high = _bound(field, config)
    if field.kind in ("int", "ints"):
        if low is not None:
            below = st.integers(max_value=math.ceil(low) - 1)
            options.append(below if field.kind == "int" else st.lists(below, min_size=1))
        if high is not None:
            options.append(st.integers(min_value=math.floor(high) + (0 if field.high_open else 1)))
        if field.power_of_two:
            options.append(st.integers(3, BIG).filter(lambda v: v & (v - 1)))
    if field.kind == "float":
        if low is not None:
            options.append(st.floats(max_value=low, exclude_max=not field.low_open,
                                     allow_nan=False, allow_infinity=False))
        if high is not None:
            options.append(st.floats(min_value=high, exclude_min=not field.high_open,
                                     allow_nan=False, allow_infinity=False))
    if field.choices:
        options.append(st.text(max_size=8).filter(lambda v: v not in field.choices))
    if field.nonempty:
        options.append(st.sampled_from(["", "  "]))
    # A value that means off is allowed beside the range (model.depth_alpha's None and 0).
    return st.one_of(options).filter(lambda v: isinstance(v, bool) or v not in field.off)


# Free-form strings whose valid values are known elsewhere (a policy that exists, a source that
# opens without a network): the values the valid-value test draws from.
STRING_EXAMPLES = {"policy": st.sampled_from(["inv_sqrt_dk", "none", "inv_dk", "const:0.1",
                                               "learned", "qk_layernorm"]),
                   "layer_policies": st.just(""), "data.source": st.just("shakespeare")}


def valid_values(field: schema.Field, config: dict) -> st.SearchStrategy:
    """Values inside `field`'s declaration that the rest of `config` allows too."""
    low, high = _bound(field, config)
    # A field another one's bound refers to must stay above that one's value (steps >= warmup).
    floor = max([config_value(config, other.name) for other in schema.FIELDS
                 if other.high == field.name] + [low if low is not None else -BIG])
    if field.name in ("model.max_seq_len",):  # learned positions: seq_len <= max_seq_len
        floor = max(floor, config["data"]["seq_len"], *config["train"]["eval_seq_lens"])
    if field.name in ("data.seq_len",):
        high = config["model"]["max_seq_len"]
    if field.kind == "int":
        top = high if high is not None else min(BIG, max(floor, 0) + BIG)
        values = st.integers(math.ceil(floor), math.floor(top) - (1 if field.high_open else 0))
        return values.filter(lambda v: v & (v - 1) == 0) if field.power_of_two else values
    if field.kind == "float":
        return st.floats(floor, high if high is not None else 1e6, exclude_min=field.low_open,
                         exclude_max=field.high_open, allow_nan=False)
    if field.kind == "ints":
        return st.lists(st.integers(max(1, math.ceil(floor)),
                                    config["model"]["max_seq_len"]), max_size=3)
    if field.choices:
        return st.sampled_from(field.choices)
    if field.kind == "bool":
        return st.booleans()
    if field.kind == "strs":
        return st.lists(st.text(max_size=5), max_size=3)
    return STRING_EXAMPLES.get(field.name, st.text(min_size=1, max_size=8).filter(str.strip))


def config_value(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config[key]
    return config


def with_value(dotted: str, value) -> ml_collections.ConfigDict:
    """The tiny test config with `dotted` set to `value` (any type: built from a dict)."""
    config = tiny_config().to_dict()
    section, _, key = dotted.rpartition(".")
    (config[section] if section else config)[key] = value
    return ml_collections.ConfigDict(config)


FIELD_NAMES = [field.name for field in schema.FIELDS]


@pytest.mark.parametrize("name", FIELD_NAMES)
@SETTINGS
@given(data=st.data())
def test_an_invalid_value_is_one_line_naming_the_field_and_creates_nothing(name, data,
                                                                           tmp_path):
    field = schema.BY_NAME[name]
    value = data.draw(invalid_values(field, tiny_config().to_dict()), label=name)
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as raised:
        run_setup.check_before_start(with_value(name, value), workdir)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{name} "), message
    assert not workdir.exists()


@pytest.mark.parametrize("name", FIELD_NAMES)
@SETTINGS
@given(data=st.data())
def test_a_valid_value_passes(name, data):
    field = schema.BY_NAME[name]
    value = data.draw(valid_values(field, tiny_config().to_dict()), label=name)
    validate(with_value(name, value))


# ------------------------------------------------ what the issue found accepted, end to end


NONSENSE = {
    "model.attention_dropout": 1.5, "train.warmup_steps": 11, "train.log_every": 0,
    "train.grad_clip": -1.0, "checkpoint.keep": 0, "data.val_batches": 0,
    "model.mlp_ratio": 0,
}


@pytest.mark.parametrize("name", list(NONSENSE))
def test_main_refuses_nonsense_in_one_line_exit_2_creating_nothing(tmp_path, name):
    before = snapshot(tmp_path)
    args = main_args(tmp_path / "run", **{name: NONSENSE[name]})
    line = one_error_line(run_module("main", *args, env=OWN_CACHE))
    assert line.startswith(f"error: {name} must be"), line
    assert snapshot(tmp_path) == before  # no run directory, no .jax_cache beside it


def test_negative_warmup_and_keep_are_refused_too():
    for name, value in (("train.warmup_steps", -1), ("checkpoint.keep", -1)):
        with pytest.raises(ConfigError, match=rf"^{name} must be"):
            validate(with_value(name, value))


def test_the_reference_lists_every_field():
    table = schema.reference()
    assert all(f"`{name}`" in table for name in FIELD_NAMES)
    assert "| `train.warmup_steps` | linear warmup steps (0: none) | an integer in [0, " \
           "train.steps] |" in table


def test_config_md_is_the_schemas_reference():
    """CONFIG.md is what the schema renders now (regenerate with `schema.REGENERATE`), and the
    README links to it."""
    published = (REPO / "CONFIG.md").read_text()
    assert published == schema.document(), f"CONFIG.md is stale: run `{schema.REGENERATE}`"
    assert published.count("\n| `") == len(schema.FIELDS)
    assert "](CONFIG.md)" in (REPO / "README.md").read_text()



def test_each_field_is_listed_once():
    """A field listed twice would be checked twice and printed twice in CONFIG.md, and the
    second entry's bounds would silently win in BY_NAME."""
    names = [field.name for field in schema.FIELDS]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
