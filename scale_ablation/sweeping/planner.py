r"""What a sweep will cost before it runs: `python -m scale_ablation.sweep ... --plan`.

Per run: parameters, tokens, passes over the training split and FLOPs (`provenance`'s counts:
training 3 × the forward, evaluation and diagnostics 1 × the forward on their own tokens). Per
distinct shape (the fields in `SHAPE_FIELDS`): the peak memory of one run's train step, from
XLA's analysis of the compiled program (`compiled.memory_analysis()`: arguments + outputs +
temporaries − what donation aliases), compiled on this machine's backend. Per program (the runs
the sweep trains as one vmapped ensemble, `ensemble.shared_config`, split into as many members
as fit in `MEMORY_SHARE` of the device's memory): seconds on the named device.

The device's rate is read from a throughput table written by the device check
(`benchmarks/results/throughput_<device kind>.json`, `benchmarks/gpu_check.py`), or on a CPU
from the arrangement table measured on this CPU family (`sweeping.arrangements.planner_table`:
the rows of the arrangement the sweep will use, `python -m benchmarks.arrangements`): the entry
nearest the program in FLOPs per token and members, its tokens/s × FLOPs per token. A CPU
table's entries also carry each run's wall seconds outside its train steps (`run_overhead_s`:
start-up, evaluation, checkpoints), added per run, and the table caps a program's members
(`max_members`: 1 when each run has a process of its own). Without a table the rate is
`ASSUMED_MFU` of the device's bfloat16 peak from `DEVICES` (vendor spec sheets, dense), and on
a CPU of a float32 matmul's rate measured in this process. Each program adds the seconds its
train step took to compile here, once per member count (jit's cache: a group's programs of
equal size share one). The plan says which rule it used.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from scale_ablation.data import sources as data_lib
from scale_ablation.model import policies
from scale_ablation.model.build import build_model
from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import ensemble, provenance, run_config, run_setup, steps
from scale_ablation.training.optim import OptimizerSettings, make_optimizer

ASSUMED_MFU = 0.4  # the rate assumed without a measured table, as a share of the peak
MEMORY_SHARE = 0.9  # of the device's memory an ensemble may fill
# Named device kinds: (what jax's device_kind contains, dense bf16 FLOP/s, memory bytes).
# Spec sheets: NVIDIA H200 and H100 SXM 989 TFLOP/s (141 GB, 80 GB), A100 312 (80 GB);
# Google Cloud TPU v4 275 (32 GiB), v5e 197 (16 GiB).
DEVICES = {
    "H200": ("H200", 989e12, 141e9),
    "H100": ("H100", 989e12, 80e9),
    "A100": ("A100", 312e12, 80e9),
    "TPU v4": ("TPU v4", 275e12, 32 * 2**30),
    "TPU v5e": ("TPU v5 lite", 197e12, 16 * 2**30),
}
SHAPE_FIELDS = ("d_model", "num_layers", "num_heads", "head_dim", "qk_dim", "mlp_ratio",
                "vocab_size", "positions", "attention_impl", "logits_dtype", "dtype")
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks", "results")
# The train split of WikiText-103 (raw) per its dataset card (num_bytes), for plans made
# without the data at hand; a local copy's own card is read when there is one.
CARD_TRAIN_BYTES = {"wikitext-103-raw-v1": 546_500_949}


@dataclasses.dataclass(frozen=True)
class Device:
    kind: str  # what jax's device_kind contains: "H200", "cpu"
    peak_flops: float
    memory_bytes: float
    peak_source: str


@dataclasses.dataclass(frozen=True)
class RunCost:
    name: str
    shape: tuple
    parameters: int
    tokens: int
    passes: float | None
    train_flops: float
    other_flops: float  # evaluation and diagnostics
    flops_per_token: float


@dataclasses.dataclass(frozen=True)
class ShapeCost:
    peak_bytes: int
    compile_seconds: float


@dataclasses.dataclass(frozen=True)
class Program:
    runs: tuple[str, ...]
    shape: tuple
    seconds: float
    rate_source: str


@dataclasses.dataclass
class Plan:
    device: Device
    runs: list[RunCost]
    shapes: dict[tuple, ShapeCost]
    programs: list[Program]

    @property
    def device_hours(self) -> float:
        return sum(p.seconds for p in self.programs) / 3600

    @property
    def train_flops(self) -> float:
        return sum(r.train_flops for r in self.runs)


def device(name: str | None = None, *, measure: bool = True) -> Device:
    """The device a plan is for: a name from `DEVICES` (or a device_kind containing one),
    "cpu", or None for this process's first device. `measure=False`: a CPU's rate is not
    measured (nan), for callers that need only its memory."""
    name = name or jax.devices()[0].device_kind
    if name.lower() == "cpu":
        return Device("cpu", matmul_flops() if measure else math.nan,
                      float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
                      "a float32 2048² matmul measured here")
    for label, (contained, peak, memory) in DEVICES.items():
        if contained.lower() in name.lower() or label.lower() in name.lower():
            return Device(contained, peak, memory, f"{label} bf16 dense peak (spec sheet)")
    raise ValueError(f"--device {name!r}: unknown; choose from cpu, {', '.join(DEVICES)}")


def matmul_flops(n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of a jitted float32 n × n matmul here (median of `reps`, after a warm-up)."""
    a = jnp.ones((n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, a))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(matmul(a, a))
        times.append(time.perf_counter() - start)
    return 2 * n**3 / float(np.median(times))


def shape_of(config: ml_collections.ConfigDict, model: ModelConfig | None = None) -> tuple:
    """What a run's compiled train step's memory depends on, as (field, value) pairs.
    `model`: the config's ModelConfig, if the caller has it."""
    model = dataclasses.asdict(run_config.model_config(config) if model is None else model)
    return (*((f, model[f]) for f in SHAPE_FIELDS if f in model),
            ("seq_len", config.data.seq_len), ("batch_size", config.train.batch_size))


def run_cost(name: str, config: ml_collections.ConfigDict) -> RunCost:
    """Tokens, passes and FLOPs of one run (its parameters counted without allocating them)."""
    model = run_config.model_config(config)
    counts = _parameter_counts(model)
    t, seq_len = config.train, config.data.seq_len
    per_token = provenance.flops_per_token(model, counts["non_embedding_parameters"], seq_len)
    tokens = t.steps * t.batch_size * seq_len
    size = train_tokens(config.data.source, seq_len)
    forward_tokens = _forward_tokens(config)
    return RunCost(name, shape_of(config), counts["parameters"], tokens,
                   tokens / size if size else None, per_token * tokens,
                   per_token / 3 * forward_tokens, per_token)


def _forward_tokens(config: ml_collections.ConfigDict) -> int:
    """Tokens of the evaluations (at step 0, every eval_every steps, the end; at each extra
    length too) and of the diagnostics (one batch every diag_every steps)."""
    t, seq_len = config.train, config.data.seq_len
    evals = t.steps // t.eval_every + 1 if t.eval_every else 0
    lengths = seq_len + sum(t.get("eval_seq_lens", ()))
    diagnostics = t.steps // t.diag_every + 1 if t.diag_every else 0
    return (evals * config.data.val_batches * t.batch_size * lengths
            + diagnostics * t.batch_size * seq_len)


def _parameter_counts(model: ModelConfig) -> dict[str, int]:
    """`provenance.parameter_counts` of `model` built abstractly, once per parameter shape: the
    fields in `NO_PARAMETERS` are set to one value and equal policies to one spec first."""
    same = {name: getattr(_REFERENCE, name) for name in NO_PARAMETERS}
    specs = tuple(_CANONICAL.setdefault(policies.get(s), s) for s in model.layer_policies)
    key = repr(dataclasses.replace(model, layer_policies=specs, **same))  # repr: no hash
    if key not in _COUNTS:
        _COUNTS[key] = _count(model)
    return _COUNTS[key]


_COUNTS: dict[str, dict[str, int]] = {}
_CANONICAL: dict[Any, str] = {}  # a policy -> the first spec seen for it
# ModelConfig fields that change no parameter's shape, and the values they are counted at.
NO_PARAMETERS = ("init", "init_gain", "norm_position", "logits_dtype", "attention_dropout",
                 "attention_impl", "dtype")
_REFERENCE = ModelConfig(d_model=1, num_layers=1, num_heads=1, head_dim=1)


def _count(model: ModelConfig) -> dict[str, int]:
    abstract = nnx.eval_shape(lambda: build_model(model, nnx.Rngs(params=0)))
    return provenance.parameter_counts(nnx.state(abstract, nnx.Param))


@functools.cache
def train_tokens(source: str, seq_len: int) -> int | None:
    """The training split's size in tokens (bytes); None where it is unknown (MQAR's
    generator, a hub corpus whose card does not give it, a source that cannot be opened)."""
    kind, _, arg = source.partition(":")
    if kind == "mqar":
        return None
    if kind == "hf":
        path, _, config = arg.partition(":")
        if os.path.isdir(path):
            from scale_ablation.data import huggingface  # the optional `datasets` package

            try:
                known = huggingface.open_corpus(arg).train_bytes
            except ValueError:
                known = None
            if known:
                return known
        return CARD_TRAIN_BYTES.get(config)
    try:
        data = ml_collections.ConfigDict({"source": source, "seq_len": seq_len})
        return int(data_lib.make_source(data, seed=0).train.size)
    except (ValueError, OSError):
        return None


def shape_cost(config: ml_collections.ConfigDict, model: ModelConfig | None = None) -> ShapeCost:
    """Peak memory of one run's train step, and the seconds compiling it took here. `model`:
    the config's ModelConfig, if the caller has it."""
    model = run_config.model_config(config) if model is None else model
    settings = OptimizerSettings.of(config, model)
    program = steps.programs(run_setup.model_graphdef(model), settings,
                             float(config.train.z_loss)).train
    rows = jax.ShapeDtypeStruct((config.train.batch_size, config.data.seq_len), jnp.int32)
    batch = {"inputs": rows, "targets": rows,
             "weights": jax.ShapeDtypeStruct(rows.shape, jnp.float32)}
    start = time.perf_counter()
    compiled = program.lower(abstract_state(model, settings), batch,
                             jax.ShapeDtypeStruct((), jnp.int32)).compile()
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes
            + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
    return ShapeCost(int(peak), seconds)


def abstract_state(model: ModelConfig, settings: OptimizerSettings) -> Any:
    """The train state `run_setup.init_state` builds, as shapes and dtypes only."""
    tx = make_optimizer(settings)

    def init():
        _, params, rest = nnx.split(build_model(model, nnx.Rngs(params=0)), nnx.Param, ...)
        return {"params": params, "rest": rest, "opt_state": tx.init(params),
                "step": jnp.zeros((), jnp.int32), "lr": jnp.zeros((), jnp.float32)}

    return jax.eval_shape(init)


def read_table(kind: str, results: str = RESULTS) -> dict | None:
    """The newest throughput table whose device_kind contains `kind`, or None."""
    found = []
    for path in glob.glob(os.path.join(results, "throughput_*.json")):
        with open(path) as f:
            table = json.load(f)
        # A --tiny check's table measures tiny models: it says the script works, not a rate.
        if kind.lower() in table.get("device_kind", "").lower() and not table.get("tiny"):
            found.append((table.get("date", ""), path, table))
    return max(found)[2] if found else None


def rate(dev: Device, flops_per_token: float, members: int,
         table: dict | None) -> tuple[float, str]:
    """(FLOP/s of a program of `members` runs of `flops_per_token`, which rule gave it)."""
    per_second, source, _ = _rate_entry(dev, flops_per_token, members, table)
    return per_second, source


def _rate_entry(dev: Device, flops_per_token: float, members: int,
                table: dict | None) -> tuple[float, str, dict]:
    """`rate` and the table's entry it came from ({} without a table)."""
    entries = (table or {}).get("entries", [])
    if not entries:
        return ASSUMED_MFU * dev.peak_flops, (
            f"no throughput table for {dev.kind}: assumed {ASSUMED_MFU:.0%} MFU of "
            f"{flops_text(dev.peak_flops)} ({dev.peak_source})"), {}

    def distance(entry: dict) -> float:
        return (abs(math.log(entry["flops_per_token"] / flops_per_token))
                + abs(math.log(entry["members"] / members)))

    entry = min(entries, key=distance)
    achieved = entry["tokens_per_s"] * entry["flops_per_token"]
    arrangement = f", {table['arrangement']}" if table.get("arrangement") else ""
    return achieved, (f"measured ({table.get('device_kind')}, {table.get('date')}"
                      f"{arrangement}): nearest entry {entry['name']} K={entry['members']}, "
                      f"{flops_text(achieved)}"), entry


def flops_text(per_second: float) -> str:
    """'165 GFLOP/s' below a TFLOP/s (a CPU's rate printed in TFLOP/s read 0.0), else '989.0
    TFLOP/s'."""
    if per_second < 1e12:
        return f"{per_second / 1e9:,.3g} GFLOP/s"
    return f"{per_second / 1e12:,.1f} TFLOP/s"


def peak_bound(config: ml_collections.ConfigDict, model: ModelConfig | None = None) -> int:
    """An over-estimate of one run's train-step peak in bytes, counted without compiling: the
    parameters with their gradient, two Adam moments and a copy in flight (×6), plus every
    layer's activations kept for the backward pass (residual-width tensors and the
    (heads, T, T) logits and weights), each ×4 for temporaries; 4 bytes per number. The
    sweep's runner compiles the step for its exact peak only when this says a group may not
    fit (tests/test_sweep_runners.py checks it lies above the compiled peak)."""
    model = run_config.model_config(config) if model is None else model
    rows, seq_len = config.train.batch_size, config.data.seq_len
    width = max(model.d_model * (1 + max(model.mlp_ratio, 1)),
                model.num_heads * model.head_dim * 4)
    per_layer = rows * seq_len * width * 8 + rows * model.num_heads * seq_len * seq_len * 3
    logits = rows * seq_len * model.vocab_size * 3  # the output logits and softmax
    numbers = 6 * _parameter_counts(model)["parameters"] + 4 * (
        model.num_layers * per_layer + logits)
    return int(4 * numbers)


def members_that_fit(dev: Device, peak_bytes: int) -> int:
    """Ensemble members per program: a vmapped program of K members holds K runs' arguments,
    outputs and temporaries, so K × one run's peak must fit in MEMORY_SHARE of the device."""
    return max(1, int(MEMORY_SHARE * dev.memory_bytes // max(peak_bytes, 1)))


def programs_of(indices: list[int], size: int) -> list[list[int]]:
    """The runs of one program key (`indices`, in order) as programs of at most `size`
    members: full ones first, the remainder last. The plan and the sweep's runner both split
    so, hence agree on the number of programs."""
    return [indices[start:start + size] for start in range(0, len(indices), size)]


def make_plan(points: list[Any], dev: Device, table: dict | None,
              memory: bool = True) -> Plan:
    """The plan of `points` (`sweep.Point`s: name and resolved config) on `dev`. Without
    `memory`, no program is compiled: members are not limited and no compile time is added."""
    costs = [run_cost(p.name, p.config) for p in points]
    shapes: dict[tuple, ShapeCost] = {}
    if memory:
        for point, cost in zip(points, costs, strict=True):
            if cost.shape not in shapes:
                shapes[cost.shape] = shape_cost(point.config)
    groups: dict[tuple, list[int]] = {}
    for index, point in enumerate(points):
        groups.setdefault(program_key(point.config), []).append(index)
    cap = (table or {}).get("max_members") or 0  # a CPU table's arrangement: K a program
    programs = []
    for indices in groups.values():
        shape = costs[indices[0]].shape
        known = shapes.get(shape)
        size = members_that_fit(dev, known.peak_bytes) if known else len(indices)
        size = min(size, cap) if cap else size
        compiled: set[int] = set()  # jit compiles a group's program once per member count
        for program in programs_of(indices, size):
            members = [costs[i] for i in program]
            flops = sum(m.train_flops + m.other_flops for m in members)
            per_second, source, entry = _rate_entry(dev, members[0].flops_per_token,
                                                    len(members), table)
            compile_seconds = known.compile_seconds if known and len(program) not in compiled \
                else 0.0
            compiled.add(len(program))
            seconds = (flops / per_second + compile_seconds
                       + len(members) * entry.get("run_overhead_s", 0.0))
            programs.append(Program(tuple(m.name for m in members), shape, seconds, source))
    return Plan(dev, costs, shapes, programs)


def program_key(config: ml_collections.ConfigDict) -> tuple:
    """Runs that train as one program (as `ensemble.ensemble_key` groups runs not yet
    started): configs equal but for `ensemble.MEMBER_FIELDS`, and layer policies that compare
    equal (every scalar policy does, `policies.ScalePolicy`), hence one graphdef."""
    layers = tuple(policies.get(spec) for spec in run_config.layer_policy_specs(config))
    return layers, ensemble.shared_config(config)
