"""The logits' sources (`model.logit_sources`, issue 53 item 5) against NumPy: the whole model's
forward written again in float64 (tests/policy_reference.py's policies, no import of the code
under test) on the same weights and tokens gives each layer's input, then q·k, q₀·k₀ through the
initial projections, the rest, and the post-scale logits, whose stds over the causal entries
the program must give. Then a short run: the metrics in its rows (the update's part 0 at step
0), in the report's row, and a resumed run's initial weights rebuilt from its seed."""

import json
import math
import os

import jax
import numpy as np
import policy_reference as ref
import pytest
from flax import nnx
from helpers import tiny_config

from scale_ablation import report
from scale_ablation.analysis import scale_predictor
from scale_ablation.model import logit_sources
from scale_ablation.training import run_setup, train
from scale_ablation.training.evaluation import Evaluator

TOKENS = np.random.default_rng(0).integers(0, 256, (3, 32))


def _layer_norm(x, p):
    return ref.layer_norm(x, (-1,), 1e-6) * p["scale"] + p["bias"]


def _gelu(x):  # jax.nn.gelu's default, the tanh form
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _rotary(x):
    """Split-halves rotary embedding over the last axis of x [B, T, H, D]."""
    half, seq = x.shape[-1] // 2, x.shape[1]
    angles = np.arange(seq)[:, None] * 10_000.0 ** (-np.arange(half) / half)  # [T, D/2]
    sin, cos = np.sin(angles)[None, :, None], np.cos(angles)[None, :, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def _linear(x, p):
    return x @ p["kernel"] + p.get("bias", 0.0)


def _raw_qk(x, query, key, heads, rotary):
    """q, k [B, T, H, D] through the given projections and the rotary positions."""
    split = lambda a: a.reshape(*x.shape[:2], heads, -1)  # noqa: E731  [B,T,H·D] -> [B,T,H,D]
    q, k = split(_linear(x, query)), split(_linear(x, key))
    return (_rotary(q), _rotary(k)) if rotary else (q, k)


def _transformed(q, k, att, policy):
    """The policy's q/k transform (ref.attend makes its own from the raw q and k)."""
    return policy["qk"](att["policy_params"], q, k, q.shape[-1]) if "qk" in policy else (q, k)


def _visible_std(logits):
    seq = logits.shape[-1]
    values = logits[np.broadcast_to(np.tril(np.ones((seq, seq), bool)), logits.shape)]
    return values.std()


def numpy_sources(params, initial, spec, heads, rotary):
    """{attn/layer{i}/qk_std...}: the model's forward in float64, pre-norm blocks."""
    policy = ref.REFERENCES[spec]
    x = params["embed"]["embedding"][TOKENS]
    if not rotary:
        x = x + params["position_embed"]["embedding"][: TOKENS.shape[1]]
    out = {}
    for i in range(len(params["blocks"])):
        block = params["blocks"][i]
        att = block["attention"]
        h = _layer_norm(x, block["attention_norm"])
        raw_q, raw_k = _raw_qk(h, att["query"], att["key"], heads, rotary)
        q, k = _transformed(raw_q, raw_k, att, policy)
        q0, k0 = _transformed(*_raw_qk(h, initial[i]["query"], initial[i]["key"], heads, rotary),
                              att, policy)
        logits, from_init = (np.einsum("bqhd,bkhd->bhqk", a, b) for a, b in ((q, k), (q0, k0)))
        seq, d = logits.shape[-1], q.shape[-1]
        visible = np.tril(np.ones((seq, seq), bool))
        entering = policy["pre"](logits, visible) if "pre" in policy else logits
        scale = policy["scale"](att["policy_params"], np.arange(seq), seq, d, heads)  # [Tq, H]
        scaled = entering * scale.T[None, :, :, None]
        out.update({f"attn/layer{i}/qk_std": _visible_std(logits),
                    f"attn/layer{i}/qk_std_init": _visible_std(from_init),
                    f"attn/layer{i}/qk_std_update": _visible_std(logits - from_init),
                    f"attn/layer{i}/qk_std_scaled": _visible_std(scaled)})
        v = _linear(h, att["value"]).reshape(*h.shape[:2], heads, -1)
        attended, _ = ref.attend(policy, att["policy_params"], raw_q, raw_k, v)
        x = x + _linear(attended.reshape(*h.shape[:2], -1), att["out"])
        x = x + _linear(_gelu(_linear(_layer_norm(x, block["mlp_norm"]), block["mlp_in"])),
                        block["mlp_out"])
    return out


def _float64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _moved(params, seed):
    """Every parameter moved by noise, as training would (zero-initialised biases included)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda a: a + (0.5 * np.std(np.asarray(a)) + 0.05) * rng.standard_normal(a.shape)
        .astype(np.float32), params)


@pytest.mark.parametrize("init,spec,positions", [
    ("gpt2", "c_inv_sqrt_dk:3", "learned"),  # biases; a constant scale
    ("fan_in", "log_length", "rotary"),  # a scale per query and head, rotary q and k
    ("gpt2", "qk_rmsnorm", "learned"),  # the q/k transform has learned gains
    ("fan_in", "logit_layernorm", "learned"),  # a transform of the logits before the scale
])
def test_against_numpy(init, spec, positions):
    config = tiny_config(**{"model.init": init, "model.num_layers": 2, "policy": spec,
                            "model.positions": positions, "model.qk_dim": 8})
    graphdef, state = run_setup.init_state(config)
    initial = logit_sources.initial_qk(nnx.merge(graphdef, state["params"], state["rest"]))
    moved = {**state, "params": _moved(state["params"], 1)}
    got = jax.jit(logit_sources.make_step(graphdef))(moved, initial, {"inputs": TOKENS})
    params = _float64(nnx.to_pure_dict(moved["params"]))
    initial_np = [{name: dict(zip(("kernel", "bias"), _float64(p), strict=True))
                   for name, p in layer.items()} for layer in initial]
    for layer in initial_np:  # fan_in has no biases
        for p in layer.values():
            if p["bias"] is None:
                del p["bias"]
    want = numpy_sources(params, initial_np, spec, config.model.num_heads,
                         positions == "rotary")
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(float(got[name]), value, rtol=2e-4, err_msg=name)
    # Moved weights: the update's part is not nothing, and the two parts are not the whole.
    assert float(got["attn/layer0/qk_std_update"]) > 0.05 * float(got["attn/layer0/qk_std"])


def test_at_initialisation_the_logits_are_the_initial_weights():
    config = tiny_config(**{"model.num_layers": 2, "policy": "c_inv_sqrt_dk:0.5"})
    graphdef, state = run_setup.init_state(config)
    initial = logit_sources.initial_qk(nnx.merge(graphdef, state["params"], state["rest"]))
    got = jax.jit(logit_sources.make_step(graphdef))(state, initial, {"inputs": TOKENS})
    for i in range(2):
        assert float(got[f"attn/layer{i}/qk_std_update"]) == 0.0
        assert float(got[f"attn/layer{i}/qk_std"]) == float(got[f"attn/layer{i}/qk_std_init"])
        np.testing.assert_allclose(float(got[f"attn/layer{i}/qk_std_scaled"]),
                                   0.5 / math.sqrt(16) * float(got[f"attn/layer{i}/qk_std"]),
                                   rtol=1e-6)


def test_initial_weights_outlive_a_donated_state():
    """The train step donates its input state: the kept weights are copies, not its buffers."""
    config = tiny_config()
    graphdef, state = run_setup.init_state(config)
    initial = logit_sources.initial_qk(nnx.merge(graphdef, state["params"], state["rest"]))
    jax.jit(lambda s: jax.tree.map(lambda a: a + 1, s), donate_argnums=0)(state["params"])
    assert all(np.isfinite(np.asarray(p[0])).all() for layer in initial for p in layer.values())


def _rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_a_run_logs_them_and_a_resumed_run_rebuilds_its_initial_weights(tmp_path):
    config = tiny_config(**{"train.diag_every": 5, "model.init": "gpt2"})
    workdir = str(tmp_path / "run")
    train.train(config, workdir)
    rows = {r["step"]: r for r in _rows(workdir) if "attn/layer0/qk_std" in r}
    assert sorted(rows) == [0, 5, 10]
    assert rows[0]["attn/layer0/qk_std_update"] == 0.0
    assert rows[10]["attn/layer0/qk_std_update"] > 0.0
    # The run's state restored from its step-10 checkpoint: the evaluator rebuilds the initial
    # q/k weights from the seed, and they are the ones the run started from.
    resumed = run_setup.prepare(config, workdir)
    assert int(resumed.state["step"]) == 10
    _, fresh = run_setup.init_state(config)
    want = logit_sources.initial_qk(nnx.merge(resumed.graphdef, fresh["params"], fresh["rest"]))
    got = Evaluator(resumed).initial_qk
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()),
                                     got, want))
    row = report.summarise_run({"name": "run", "overrides": {}, "metrics": _rows(workdir),
                                "summary": {"status": "completed"}, "config": config.to_dict()})
    for stat in logit_sources.STATS:
        assert row[f"final_{stat}"] == rows[10][f"attn/layer0/{stat}"]
        assert row[f"final_{stat}/layer0"] == rows[10][f"attn/layer0/{stat}"]


def test_rows_of_runs_without_them_are_unchanged():
    row = scale_predictor.row_fields({"step": 10, "attn/layer0/logit_std": 1.0})
    assert row == {}
