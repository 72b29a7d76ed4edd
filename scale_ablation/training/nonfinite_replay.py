"""Replay a diverged run's step from its last checkpoint and find the first non-finite equation
(the command that prints it: `python -m scale_ablation.nonfinite`).

A diverged run keeps its last good state as a checkpoint (step d - 1, d its
`diverged_at_step`). This replays step d from it, on the same batch and dropout key: first as
the train step computes it (one compiled program: is the loss finite, which gradients are
not), then as the traced program of the loss and its gradient, evaluated one equation at a
time, to find the first equation that makes an inf from inputs that hold none (an overflow; a
deliberate -inf, such as the causal mask's, converted or selected, is not one) and the first
whose output holds a NaN (an inf can be harmless, a NaN is not): each with its operation and
the line of code it comes from (an
equation of the gradient carries the line it differentiates), first in the loss alone (the
forward pass), then, if that is finite, in the loss and its gradient.

The equation-at-a-time replay rounds every intermediate to its dtype, where a compiled
program may keep some in float32 inside a fused kernel; so it can meet an overflow that the
compiled step did not, or miss one. Both results are printed: the first is what the run did.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.extend import core as jex_core

from scale_ablation.data import sources as data_lib
from scale_ablation.records.checkpoints import CheckpointError, Checkpoints
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import steps
from scale_ablation.training.run_setup import init_state

# Primitives that call a sub-program: the walk goes inside them, so that the equation it
# reports is an operation (a tanh, a multiply), not the call around it.
CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
                   "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint"})
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # scale_ablation/


@dataclasses.dataclass(frozen=True)
class Finding:
    """An equation whose output holds an inf (or a NaN)."""

    primitive: str
    where: str  # file:line (function) of the code the equation comes from
    inputs_max_abs: tuple[float, ...]  # largest finite |value| of each floating input

    def describe(self) -> str:
        inputs = ", ".join("none finite" if math.isnan(v) else f"{v:.4g}"
                           for v in self.inputs_max_abs) or "none"
        return f"{self.primitive} at {self.where} (largest finite |input|: {inputs})"


@dataclasses.dataclass
class Origins:
    """The first equation, in program order, that makes an inf from inf-free inputs, and the
    first with a NaN in its output. An inf can be harmless (exp(-inf) is 0: a masked logit minus the row's maximum
    overflows to -inf in float16 and weighs nothing), so the walk goes on past it to the
    first NaN, which always is not."""

    inf: Finding | None = None
    nan: Finding | None = None


def nonfinite_origins(fn: Callable, *args: Any) -> Origins:
    """Where `fn`'s traced program, run on `args`, first makes an inf and first a NaN."""
    closed = jax.make_jaxpr(fn)(*args)
    origins = Origins()
    _walk(closed.jaxpr, closed.consts, jax.tree.leaves(args), origins)
    return origins


def first_nonfinite(fn: Callable, *args: Any) -> Finding | None:
    """The first equation of `fn`'s traced program whose output holds an inf or NaN when it
    runs on `args`; None when every output is finite."""
    return (origins := nonfinite_origins(fn, *args)).inf or origins.nan


def _walk(jaxpr: jex_core.Jaxpr, consts: Sequence[Any], args: Sequence[Any],
          origins: Origins) -> list[Any] | None:
    """Evaluate `jaxpr` equation by equation, noting the first inf and the first NaN in
    `origins`: its outputs, or None once a NaN is found."""
    env: dict[Any, Any] = {}

    def read(var):
        return var.val if isinstance(var, jex_core.Literal) else env[var]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        inputs = [read(v) for v in eqn.invars]
        outputs = _run(eqn, inputs, origins)
        if outputs is None:
            return None
        made_inf = (any(_has(jnp.isinf, x) for x in outputs)
                    and not any(_has(jnp.isinf, x) for x in inputs))
        if origins.inf is None and made_inf:
            origins.inf = _finding(eqn, inputs)
        if any(_has(jnp.isnan, x) for x in outputs):
            origins.nan = _finding(eqn, inputs)
            return None
        for var, value in zip(eqn.outvars, outputs, strict=True):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _finding(eqn, inputs: list[Any]) -> Finding:
    return Finding(eqn.primitive.name, _where(eqn),
                   tuple(_max_abs(x) for x in inputs if _floating(x)))


def _run(eqn, inputs: list[Any], origins: Origins) -> list[Any] | None:
    """One equation's outputs (a list), walking into calls; None once a NaN is found."""
    if eqn.primitive.name in CALLS:
        inner = next((eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr")
                      if k in eqn.params), None)
        if inner is not None:
            consts = getattr(inner, "consts", ())
            return _walk(getattr(inner, "jaxpr", inner), consts, inputs, origins)
    outputs = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
    return list(outputs) if eqn.primitive.multiple_results else [outputs]


def _floating(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _has(test: Callable, x: Any) -> bool:
    return _floating(x) and bool(jnp.any(test(x)))


def _finite(x: Any) -> bool:
    return not _floating(x) or bool(jnp.all(jnp.isfinite(x)))


def _max_abs(x: Any) -> float:
    values = np.abs(np.asarray(x, np.float64))
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else float("nan")


def _where(eqn) -> str:
    """The innermost frame of this package's code that made the equation (else the innermost
    outside JAX), and the innermost outside JAX when that is in a library (flax's norm)."""
    frames = list(eqn.source_info.traceback.frames) if eqn.source_info.traceback else []
    if not frames:
        return "unknown"
    ours = [f for f in frames if os.path.abspath(f.file_name).startswith(PACKAGE_DIR)]
    outside_jax = [f for f in frames if f"{os.sep}jax{os.sep}" not in f.file_name]
    frame = (ours or outside_jax or frames)[0]
    where = _frame(frame)
    if outside_jax and outside_jax[0] is not frame:
        where += f", inside {_frame(outside_jax[0])}"
    return where


def _frame(frame) -> str:
    name = frame.file_name
    if name.startswith(os.getcwd() + os.sep):
        name = os.path.relpath(name)
    return f"{name}:{frame.line_num} ({frame.function_name})"


@dataclasses.dataclass
class Replay:
    """Step d of a diverged run, ready to run again."""

    loss: Callable[[Any], tuple[jax.Array, jax.Array]]  # params -> (with z-loss, loss)
    loss_and_grad: Callable[[Any], tuple[tuple[jax.Array, jax.Array], Any]]
    params: Any
    step: int  # d


def load_replay(workdir: str) -> Replay:
    """The diverged run in `workdir`, restored at its last good step. ValueError, naming what
    is missing, when `workdir` holds no diverged run that kept its last good state."""
    files = RunFiles(workdir)
    summary, config_dict = files.read_summary(), files.read_config()
    if summary is None or config_dict is None:
        raise ValueError(f"{workdir} holds no run (no summary.json or config.json)")
    if summary.get("status") != "diverged":
        raise ValueError(f"{workdir}: the run is {summary.get('status')}, not diverged")
    step = int(summary["diverged_at_step"])
    config = ml_collections.ConfigDict(config_dict)
    graphdef, like = init_state(config)
    checkpoints = Checkpoints(workdir)
    try:
        state = checkpoints.restore(step - 1, like)
    except (CheckpointError, FileNotFoundError, ValueError) as error:
        raise ValueError(f"{workdir}: no checkpoint of step {step - 1}, the last good one (runs "
                         f"before the loop kept it cannot be replayed): {error}") from None
    finally:
        checkpoints.close()
    t = config.train
    source = data_lib.make_source(config.data, seed=t.seed)
    rows = source.train_batch(step - 1, t.batch_size, config.data.seq_len)  # step d reads d - 1
    batch = {name: jnp.asarray(getattr(rows, name)) for name in ("inputs", "targets", "weights")}
    key = steps.dropout_key(t.seed, step - 1)
    loss_fn = steps.make_loss(graphdef, float(t.z_loss))

    def loss(params):
        return loss_fn(params, state, batch, key)

    return Replay(loss, jax.value_and_grad(loss, has_aux=True), state["params"], step)


def nonfinite_gradients(grads: Any) -> list[str]:
    """Dotted paths (blocks.0.mlp_in.kernel) of the gradient arrays that hold an inf or NaN."""
    leaves = jax.tree_util.tree_flatten_with_path(grads)[0]
    return [_dotted(path) for path, leaf in leaves if not _finite(leaf)]


def _dotted(path: Sequence[Any]) -> str:
    parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    return ".".join(parts[:-1] if parts and parts[-1] == "value" else parts)


def diagnose(workdir: str) -> list[str]:
    """The report's lines."""
    replay = load_replay(workdir)
    (_, loss), grads = jax.jit(replay.loss_and_grad)(replay.params)
    bad, total = nonfinite_gradients(grads), len(jax.tree.leaves(grads))
    named = "all" if len(bad) == total else ", ".join(bad)
    lines = [f"step {replay.step}, replayed from the checkpoint of step {replay.step - 1}",
             f"compiled step: loss {float(loss):.6g}; {len(bad)} of {total} gradient arrays "
             "non-finite" + (f" ({named})" if bad else "")]
    if np.isfinite(float(loss)) and not bad:
        lines.append("the compiled replay is finite: the divergence does not reproduce "
                     "(a different device or XLA version may round differently)")
    forward = nonfinite_origins(replay.loss, replay.params)
    if forward.inf or forward.nan:
        lines += _origin_lines("in the forward pass", forward)
    else:
        lines += _origin_lines("computing the gradient (the forward pass is finite)",
                               nonfinite_origins(replay.loss_and_grad, replay.params))
    return lines


def _origin_lines(where: str, origins: Origins) -> list[str]:
    if not (origins.inf or origins.nan):
        return ["equation by equation, every output is finite"]
    return [f"first {kind}, {where}: {finding.describe()}"
            for kind, finding in (("inf", origins.inf), ("NaN", origins.nan)) if finding]
