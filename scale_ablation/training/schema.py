"""The run config's schema: every field's type, range and meaning, declared once.

`check(config)` derives the checks from `FIELDS`: one `ConfigError` line naming the first bad
field, its meaning and its allowed values (`training.run_config.validate` calls it first).
`reference()` derives the field reference (a Markdown table, published as CONFIG.md by
`REGENERATE`). A range may name another field (`high="train.steps"`): cross-field rules such
as 0 <= warmup_steps <= steps live here too.
Rules that need more than a range (a policy that exists, a batch that divides over the devices,
the MQAR generator's own limits) stay with the code that knows them (`run_config`,
`model.spec.ModelConfig.check`, `data.sources`). Every field of `experiments/base.py`'s config
needs an entry (tests/test_schema.py fails naming any without one).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from scale_ablation.errors import ConfigError
from scale_ablation.model.spec import DTYPES, INITS
from scale_ablation.records.wandb_tracker import WANDB_MODES

Bound = float | str | None  # a number, or the dotted name of a field whose value it is

KINDS = ("int", "float", "str", "bool", "ints", "strs")  # "ints": a sequence of ints


@dataclasses.dataclass(frozen=True)
class Field:
    """One config field: `kind` (KINDS), an inclusive range [low, high] (`low_open`,
    `high_open`: that end excluded), allowed `choices` for a str, whether it is set by some
    experiments only (`optional`), and what it means, in one line. A field absent from a
    config is not checked (the code's default applies)."""

    name: str
    kind: str
    meaning: str
    low: Bound = None
    high: Bound = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False
    power_of_two: bool = False
    nonempty: bool = False
    off: tuple[Any, ...] = ()  # values allowed beside the range, each meaning "off"

    def bounds(self, config: Mapping[str, Any]) -> tuple[float | None, float | None]:
        """(low, high) with field references resolved against `config` (a nested dict)."""
        return _resolve(self.low, config), _resolve(self.high, config)

    def allowed(self, config: Mapping[str, Any]) -> str:
        """The allowed values, in words: 'an integer in 1..train.steps=60'."""
        if self.off:
            values = " or ".join(str(v) for v in self.off)
            return f"{dataclasses.replace(self, off=()).allowed(config)}, or {values} (off)"
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        noun = {"int": "an integer", "float": "a finite number", "str": "a string",
                "bool": "true or false", "ints": "a list of integers",
                "strs": "a list of strings"}[self.kind]
        if self.nonempty:
            noun = f"a non-empty {noun.removeprefix('a ')}"
        if self.power_of_two:
            noun += " power of two"
        if self.low == 0 and self.low_open and self.high is None:
            return noun.replace("a finite", "a positive finite").replace("an integer",
                                                                        "a positive integer")
        low, high = (self._bound_text(b, config) for b in (self.low, self.high))
        if low is not None and high is not None:
            return (f"{noun} in {'(' if self.low_open else '['}{low}, "
                    f"{high}{')' if self.high_open else ']'}")
        if low is not None:
            return f"{noun} {'>' if self.low_open else '>='} {low}" + (
                " each" if self.kind == "ints" else "")
        if high is not None:
            return f"{noun} {'<' if self.high_open else '<='} {high}"
        return noun

    @staticmethod
    def _bound_text(bound: Bound, config: Mapping[str, Any]) -> str | None:
        if bound is None:
            return None
        if isinstance(bound, str):
            value = _lookup(config, bound)
            return bound if value is _MISSING else f"{bound}={value}"
        return f"{bound:g}"


def _f(name: str, kind: str, meaning: str, **rules) -> Field:
    return Field(name, kind, meaning, **rules)


FIELDS: tuple[Field, ...] = (
    _f("policy", "str", "scale policy spec of every layer (model.policies.available())",
       nonempty=True),
    _f("layer_policies", "str", "per-layer policy specs, comma-separated; overrides policy"),
    # model
    _f("model.d_model", "int", "residual stream width", low=1),
    _f("model.num_layers", "int", "Transformer blocks", low=1),
    _f("model.num_heads", "int", "attention heads per block", low=1),
    _f("model.head_dim", "int", "each head's value width, and its query/key width (d_k) unless "
       "model.qk_dim is set (independent of d_model)", low=1),
    _f("model.mlp_ratio", "int", "MLP hidden width in units of d_model", low=1),
    _f("model.norm", "str", "normalisation layer", choices=("layernorm", "rmsnorm")),
    _f("model.norm_position", "str", "norm before (pre) or after (post) each sublayer",
       choices=("pre", "post")),
    _f("model.positions", "str", "position encoding", choices=("learned", "rotary")),
    _f("model.max_seq_len", "int", "learned position table size", low=1),
    _f("model.init", "str", "q/k/v/output kernel initialiser", choices=INITS),
    _f("model.init_gain", "float", "extra gain on the q/k projections", low=0),
    _f("model.logits_dtype", "str", "dtype of the attention logits: both switches below at once",
       choices=("float32", "activation")),
    _f("model.qk_product_dtype", "str", "dtype q·k accumulates and is scaled in (\"\": "
       "logits_dtype)", choices=("", "float32", "activation")),
    _f("model.softmax_dtype", "str", "dtype of the softmax input (\"\": logits_dtype)",
       choices=("", "float32", "activation")),
    _f("model.qk_dim", "int", "q/k width per head, the policies' d_k (0: model.head_dim)", low=0),
    _f("model.residual_dtype", "str", "dtype of the residual stream, norms and additions "
       "(\"\": train.dtype); the blocks' matmuls stay in train.dtype", choices=("", "float32")),
    _f("model.attention_dropout", "float", "dropout on the attention weights", low=0, high=1,
       high_open=True),
    _f("model.attention_impl", "str", "attention kernel",
       choices=("reference", "fused", "blocked", "auto")),
    _f("model.parametrization", "str", "width rules of init, readout and LRs "
       "(model/parametrization.py; umup: model/umup.py)", choices=("sp", "mup", "umup")),
    _f("model.base_d_model", "int", "μP's base width (0: the model's own d_model)", low=0),
    _f("model.base_head_dim", "int", "μP's base head dim (0: the model's own head_dim)", low=0),
    _f("model.readout_zero_init", "bool", "an untied readout initialised at zero (μP's option)"),
    _f("model.depth_alpha", "float", "CompleteP's α (model/depth.py): residual branches × "
       "(num_layers/base_num_layers)^-α, the blocks' LR × that ratio^(α-1), their Adam ε × "
       "ratio^-α", low=0.5, high=1, off=(None, 0)),
    _f("model.base_num_layers", "int", "CompleteP's base depth L_base", low=1),
    # data
    _f("data.source", "str", "training bytes: shakespeare | text:PATH | mqar | hf:NAME",
       nonempty=True),
    _f("data.seq_len", "int", "tokens per training sequence", low=1),
    _f("data.val_batches", "int", "validation batches per evaluation", low=1),
    _f("data.test_bytes", "int", "test-split bytes (MQAR: tokens) scored once at the end "
       "(data/heldout.py; 0: none)", low=0),
    _f("data.mqar_num_pairs", "int", "key/value pairs per MQAR sequence", low=1),
    _f("data.mqar_vocab_size", "int", "MQAR ids (even, at most 8192)", low=4, high=8192),
    _f("data.mqar_power_a", "float", "MQAR query-gap power law's a (Zoology: 0.01)",
       low=0, low_open=True, optional=True),
    # train
    _f("train.steps", "int", "optimiser steps of the run", low=1),
    _f("train.batch_size", "int", "sequences per step (a multiple of the devices)", low=1),
    _f("train.lr", "float", "peak learning rate", low=0, low_open=True),
    _f("train.warmup_steps", "int", "linear warmup steps (0: none)", low=0,
       high="train.steps"),
    _f("train.grad_clip", "float", "global-norm gradient clip (0: none)", low=0),
    _f("train.weight_decay", "float", "AdamW decoupled weight decay", low=0),
    _f("train.scale_lr_multiplier", "float", "scale policy parameters' LR in units of train.lr",
       low=0, low_open=True),
    _f("train.z_loss", "float", "weight of the log-partition-squared loss", low=0),
    _f("train.loss_scale", "float", "the loss's multiplier for float16 gradients: static, or "
       "a dynamic scale's start (0: none; dynamic: 2**15)", low=0),
    _f("train.loss_scale_period", "int", "dynamic loss scale: doubled after this many finite "
       "steps, halved and the step skipped on a non-finite gradient (0: static)", low=0),
    _f("train.seed", "int", "parameter and data seed", low=0, high=2**31 - 1),
    _f("train.dtype", "str", "compute dtype (parameters stay float32)", choices=tuple(DTYPES)),
    _f("train.log_every", "int", "steps between logged train rows", low=1, high="train.steps"),
    _f("train.steps_per_call", "int", "train steps per dispatched program", low=1,
       power_of_two=True),
    _f("train.eval_every", "int", "steps between evaluations (0: only at the end)", low=0),
    _f("train.diag_every", "int", "steps between attention diagnostics (0: none)", low=0),
    _f("train.eval_seq_lens", "ints", "extra validation lengths (val/loss@LEN)", low=1),
    _f("train.fsdp", "int", "devices per FSDP group (1: pure data parallel)", low=1),
    _f("train.compilation_cache", "bool", "persistent XLA cache beside the workdir"),
    # checkpoint
    _f("checkpoint.every", "int", "steps between checkpoints (0: only at the end)", low=0),
    _f("checkpoint.keep", "int", "newest checkpoints kept", low=1),
    _f("checkpoint.keep_finished", "bool", "a finished run keeps its newest checkpoint.keep "
       "checkpoints (false: only its final one)"),
    _f("checkpoint.keep_final", "bool", "a completed run keeps its final checkpoint (false, for "
       "smoke sweeps: none, and it cannot be extended)"),
    # wandb
    _f("wandb.mode", "str", "W&B mode", choices=WANDB_MODES),
    _f("wandb.project", "str", "W&B project", nonempty=True),
    _f("wandb.entity", "str", "W&B entity (empty: the default)"),
    _f("wandb.group", "str", "W&B group (a sweep sets its directory's name)"),
    _f("wandb.job_type", "str", "W&B job type"),
    _f("wandb.tags", "strs", "W&B tags"),
    _f("wandb.init_timeout", "float", "seconds before an unanswered W&B init goes offline",
       low=0, low_open=True),
    _f("wandb.name", "str", "W&B run name (default: the run directory's name)", optional=True),
)
BY_NAME = {field.name: field for field in FIELDS}
_MISSING = object()


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _resolve(bound: Bound, config: Mapping[str, Any]) -> float | None:
    if isinstance(bound, str):
        value = _lookup(config, bound)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return bound


def leaf_names(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of every leaf field of a (nested) config dict."""
    names = []
    for key, value in config.items():
        if isinstance(value, Mapping):
            names += leaf_names(value, f"{prefix}{key}.")
        else:
            names.append(f"{prefix}{key}")
    return names


def _type_ok(field: Field, value: Any) -> bool:
    def number(v: Any, integer: bool) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return isinstance(v, int) if integer else math.isfinite(v)

    if field.kind in ("int", "float"):
        return number(value, field.kind == "int")
    if field.kind in ("str", "bool"):
        return isinstance(value, {"str": str, "bool": bool}[field.kind])
    if not isinstance(value, (list, tuple)):
        return False
    return all(number(v, True) if field.kind == "ints" else isinstance(v, str) for v in value)


def field_problem(field: Field, config: Mapping[str, Any]) -> str | None:
    """Why `config`'s value of `field` is not allowed (one line naming it), or None."""
    value = _lookup(config, field.name)
    if value is _MISSING or (not isinstance(value, bool) and value in field.off):
        return None
    ok = _type_ok(field, value)
    if ok and field.choices:
        ok = value in field.choices
    if ok and field.nonempty:
        ok = bool(value.strip() if isinstance(value, str) else value)
    if ok and field.kind in ("int", "float", "ints"):
        low, high = field.bounds(config)
        numbers = value if field.kind == "ints" else [value]
        ok = all((low is None or (v > low if field.low_open else v >= low))
                 and (high is None or (v < high if field.high_open else v <= high))
                 and (not field.power_of_two or v & (v - 1) == 0) for v in numbers)
    if ok:
        return None
    return f"{field.name} must be {field.allowed(config)}, got {value!r} ({field.meaning})"


def check(config: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the first field of `config` (a nested dict, or ConfigDict's
    `to_dict()`) outside its declared type and range."""
    for field in FIELDS:
        problem = field_problem(field, config)
        if problem is not None:
            raise ConfigError(problem)


REGENERATE = "python -m scale_ablation.training.schema > CONFIG.md"


def reference() -> str:
    """The field reference as a Markdown table, from the schema (CONFIG.md's body)."""
    lines = ["| field | meaning | allowed |", "|---|---|---|"]
    for field in FIELDS:
        allowed = field.allowed({})
        lines.append(f"| `{field.name}` | {field.meaning} | {allowed.replace('|', '/')} |")
    return "\n".join(lines)


def document() -> str:
    """CONFIG.md: a header saying how it is made, then `reference()` (tests/test_schema.py
    fails when the published file differs)."""
    return (f"# Config fields: generated from scale_ablation/training/schema.py by `{REGENERATE}`"
            f"\n\n{reference()}\n")


if __name__ == "__main__":
    print(document(), end="")
