"""A run's settings: the whole config validated in one place, and its `ModelConfig` built.

`validate(config)` is the one check every entry point (a run, a sweep's grid, an ensemble's
grouping) makes before anything is written; it raises `ConfigError` with one line naming the
field. `ModelConfig` is built once from the ConfigDict and passed down the module tree, one name
per setting from the experiment file to the attention layer.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import ml_collections

from scale_ablation.data import heldout
from scale_ablation.data import sources as data_lib
from scale_ablation.errors import ConfigError
from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import schema

# Fields that define what is trained on what: a resumed or skipped run must not change them.
IDENTITY_FIELDS = ("policy", "layer_policies", "model", "data", "train.seed", "train.batch_size",
                   "train.dtype", "train.loss_scale", "train.loss_scale_period")
# Fields that define the learning-rate schedule and the run's length: a resumed or finished run
# keeps them unless the user asks to extend it (`--extend`), or the schedule changes mid-run.
SCHEDULE_FIELDS = ("train.steps", "train.warmup_steps", "train.lr")
# Fields under an identity field that change nothing trained: the test split is read once, when
# the run ends, so a run made before it existed (or with another size) resumes.
NOT_IDENTITY_FIELDS = ("data.test_bytes",)
# A model field that a stored config predates means its default (what the run was built with).
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)
                  if f.default is not dataclasses.MISSING}
# Likewise for train fields: a run made before loss scaling existed had none.
TRAIN_DEFAULTS = {"train.loss_scale": 0.0, "train.loss_scale_period": 0}


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The model of a run config (raises ConfigError naming a bad field)."""
    derived = {"layer_policies", "dtype", "vocab_size"}  # not under config.model
    fields = {f.name for f in dataclasses.fields(ModelConfig)} - derived
    model = ModelConfig(**{name: config.model[name] if name in config.model
                           or name not in MODEL_DEFAULTS else MODEL_DEFAULTS[name]
                           for name in fields},
                        layer_policies=tuple(layer_policy_specs(config)),
                        dtype=config.train.dtype,
                        vocab_size=data_lib.vocab_size(config.data))  # MQAR: its own ids
    model.check()
    return model


def layer_policy_specs(config: ml_collections.ConfigDict) -> list[str]:
    """One policy spec per layer: `layer_policies` (comma-separated) if set, else `policy`."""
    num_layers = config.model.num_layers
    if config.get("layer_policies"):
        # A comma before a digit is inside a spec's argument (`temperature:8192,0.1`).
        specs = [s.strip() for s in re.split(r",(?=\s*[A-Za-z_])", config.layer_policies)]
        if len(specs) != num_layers:
            raise ConfigError(
                f"layer_policies lists {len(specs)} policies for model.num_layers={num_layers}"
            )
        return specs
    return [config.policy] * num_layers


def validate(config: ml_collections.ConfigDict) -> ModelConfig:
    """Check a whole run config; return its ModelConfig. Raises ConfigError naming the field.

    Each field's type and range first (`schema`), then the rules that need more than one.
    """
    schema.check(config.to_dict())
    try:
        _validate_train(config)
        model = model_config(config)
    except ConfigError:
        raise
    except (ValueError, ZeroDivisionError, ArithmeticError) as error:
        raise ConfigError(str(error)) from None
    return model


def _validate_train(config: ml_collections.ConfigDict) -> None:
    """The rules over several fields that the schema's ranges do not express."""
    t, d, m = config.train, config.data, config.model
    if t.batch_size <= 0 or t.batch_size % jax.device_count():
        raise ConfigError(f"train.batch_size={t.batch_size} must be a positive multiple of the "
                          f"{jax.device_count()} devices")
    if d.seq_len <= 0 or (m.positions == "learned" and d.seq_len > m.max_seq_len):
        raise ConfigError(f"data.seq_len={d.seq_len} must be in 1..model.max_seq_len="
                          f"{m.max_seq_len}")
    for seq_len in t.get("eval_seq_lens", ()):
        if seq_len <= 0 or (m.positions == "learned" and seq_len > m.max_seq_len):
            raise ConfigError(f"train.eval_seq_lens: {seq_len} must be in 1..model.max_seq_len="
                              f"{m.max_seq_len} with learned positions (rotary has no limit)")
    if d.source == "mqar":  # a generator: its settings can be checked before anything runs
        data_lib.mqar_source(d, seed=0).check(d.seq_len)  # ValueError naming the field
    heldout.window_count(d.get("test_bytes", 0), d.seq_len)  # ValueError naming the field


def changed_identity_fields(old: dict, new: dict,
                            fields: tuple[str, ...] = IDENTITY_FIELDS) -> list[str]:
    """Dotted names of `fields` (default: the identity fields) that differ between two config
    dicts."""
    old_flat, new_flat = _flatten(old), _flatten(new)
    keys = sorted(set(old_flat) | set(new_flat))
    default = lambda key: (MODEL_DEFAULTS.get(key.removeprefix("model."))  # noqa: E731
                           if key.startswith("model.") else TRAIN_DEFAULTS.get(key))
    return [
        key for key in keys
        if any(key == f or key.startswith(f + ".") for f in fields)
        and key not in NOT_IDENTITY_FIELDS
        and _normalise(old_flat.get(key, default(key))) != _normalise(new_flat.get(key,
                                                                                  default(key)))
    ]


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _normalise(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
