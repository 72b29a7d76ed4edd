"""How much each intervention acted, as a run logs it (issue 54), against independent counts:
the soft-cap's share of logits past its knee and the z-loss's share of the objective against
NumPy on the same inputs, QK-clip's count of clipped steps against NumPy's largest logits, a
dynamic loss scale's skipped steps against the steps' own gradient norms, and the report's row
fields against the logged rows."""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from helpers import tiny_config
from test_qk_clip import BATCH, HEADS, max_logits, split_model

from scale_ablation import report
from scale_ablation.model import attention, diagnostics, policies
from scale_ablation.records import intervention_rows
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import hooks, steps, train
from scale_ablation.training.loop import Tick


def normal(seed: int, shape: tuple, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale


# --------------------------------------------------------------------------- soft-cap


def test_share_past_the_knee_against_numpy_on_the_uncapped_logits():
    cap = 30.0
    q, k = normal(0, (2, 24, 3, 16), 3.0), normal(1, (2, 24, 3, 16), 3.0)
    _, internals = attention.attend(jnp.asarray(q), jnp.asarray(k), jnp.asarray(k),
                                    policy=policies.get(f"softcap:{cap:g}"),
                                    return_internals=True)
    found = np.asarray(diagnostics.past_knee(internals.logits, internals.mask, cap))
    # NumPy: the logits before the cap, from q and k, and the visible ones past C/2.
    z = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / 4.0
    visible = np.broadcast_to(np.tril(np.ones((24, 24), bool)), z.shape)
    expected = ((np.abs(z) > cap / 2) & visible).sum(axis=(0, 2, 3)) / visible.sum(axis=(0, 2, 3))
    assert expected.min() > 0.05 and expected.max() < 0.95  # a test with both kinds of logit
    np.testing.assert_allclose(found, expected, rtol=1e-6)


def test_a_composed_cap_keeps_its_knee_and_a_model_logs_the_share():
    assert policies.get("qk_rmsnorm+softcap:20").soft_cap == 20.0
    assert policies.get("softcap:20").soft_cap == 20.0
    assert policies.get("inv_sqrt_dk").soft_cap is None
    graphdef, params, rest = split_model("softcap:2")
    state = {"params": params, "rest": rest}
    logged = jax.jit(steps.make_diagnostics_step(graphdef))(state, BATCH)
    for head in range(HEADS):
        share = float(logged[f"attn/layer0/head{head}/softcap_past_knee"])
        assert 0.0 <= share <= 1.0
    assert float(logged["attn/layer0/softcap_past_knee"]) == pytest.approx(
        np.mean([float(logged[f"attn/layer0/head{h}/softcap_past_knee"]) for h in range(HEADS)]))


# --------------------------------------------------------------------------- z-loss


def test_z_loss_share_against_numpy():
    logits = normal(2, (3, 7, 11), 4.0)
    targets = np.random.default_rng(3).integers(0, 11, (3, 7))
    weights = (np.random.default_rng(4).random((3, 7)) > 0.3).astype(np.float32)
    found = float(steps.z_loss_share(jnp.asarray(logits), jnp.asarray(targets),
                                     jnp.asarray(weights), 1e-2))
    x = logits.astype(np.float64)
    log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    nll = log_z - np.take_along_axis(x, targets[..., None], -1)[..., 0]
    z_term = 1e-2 * (log_z**2 * weights).sum() / weights.sum()
    expected = z_term / ((nll * weights).sum() / weights.sum() + z_term)
    assert found == pytest.approx(expected, rel=1e-5)


def test_the_diagnostics_log_the_z_loss_share_only_with_a_z_loss():
    graphdef, params, rest = split_model("inv_sqrt_dk")
    state = {"params": params, "rest": rest}
    without = jax.jit(steps.make_diagnostics_step(graphdef))(state, BATCH)
    assert "diag/z_loss_share" not in without
    logged = jax.jit(steps.make_diagnostics_step(graphdef, 1e-4))(state, BATCH)
    logits, _ = jax.jit(lambda s: steps.nnx.merge(graphdef, s["params"], s["rest"])(
        BATCH["inputs"]))(state)
    expected = steps.z_loss_share(logits, BATCH["targets"], BATCH["weights"], 1e-4)
    assert float(logged["diag/z_loss_share"]) == pytest.approx(float(expected), rel=1e-6)


# --------------------------------------------------------------------------- QK-clip


def test_clipped_steps_are_counted_per_head_against_numpys_largest_logits():
    graphdef, params, rest = split_model("qk_clip:1e9")
    before = max_logits(graphdef, params, rest)  # NumPy, from the layer's q and k
    threshold = float(before.mean())  # one head above T, one below
    graphdef, params, rest = split_model(f"qk_clip:{threshold}")
    tx = optax.sgd(1.0)
    state = {"params": params, "rest": rest, "opt_state": tx.init(params),
             "step": jnp.int32(0), "lr": jnp.float32(0.0)}
    step = jax.jit(steps.make_train_step(graphdef, tx, 0.0))
    state, _ = step(state, BATCH, None)
    counts = np.asarray(state["rest"]["blocks"][0]["attention"]["clip_count"].get_value())
    np.testing.assert_array_equal(counts, (before > threshold).astype(np.float32))
    logged = jax.jit(steps.make_diagnostics_step(graphdef))(state, BATCH)
    for head in range(HEADS):
        assert float(logged[f"attn/layer0/head{head}/qk_clip_clipped_steps"]) == counts[head]
    assert float(logged["attn/layer0/qk_clip_clipped_steps"]) == counts.max()  # the layer's


def test_the_count_accumulates_over_steps():
    """Each step starts from the unclipped weights again (only `rest`, which holds the count,
    is carried): NumPy's heads above T are clipped at every step and counted each time."""
    graphdef, params, rest = split_model("qk_clip:1e9")
    before = max_logits(graphdef, params, rest)
    threshold = float(before.mean())
    graphdef, params, rest = split_model(f"qk_clip:{threshold}")
    tx = optax.sgd(1.0)
    step = jax.jit(steps.make_train_step(graphdef, tx, 0.0))
    for _ in range(3):
        state = {"params": params, "rest": rest, "opt_state": tx.init(params),
                 "step": jnp.int32(0), "lr": jnp.float32(0.0)}
        rest = step(state, BATCH, None)[0]["rest"]
    counts = np.asarray(rest["blocks"][0]["attention"]["clip_count"].get_value())
    np.testing.assert_array_equal(counts, 3 * (before > threshold).astype(np.float32))


# --------------------------------------------------------------------------- loss scale


def skip_config(period: int) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({
        "train": {"loss_scale": 0.0, "loss_scale_period": period, "log_every": 4},
        "checkpoint": {"every": 6}})


def member(start_step: int = 0, logged: list[dict] | None = None) -> SimpleNamespace:
    files = None if logged is None else SimpleNamespace(read_metrics=lambda: logged)
    return SimpleNamespace(start_step=start_step, summary_fields={},
                           trackers=SimpleNamespace(files=files))


def run_ticks(hook, who, grad_norms, first_step=1) -> dict[int, dict]:
    rows = {}
    last = first_step + len(grad_norms) - 1
    for step, norm in enumerate(grad_norms, first_step):
        tick = Tick(step=step, last=step == last, metrics={"train/grad_norm": norm},
                    step_seconds=0.0, state=dict)
        hook.action(who, tick)
        rows[step] = tick.row
    return rows


GRAD_NORMS = [1.0, math.inf, 2.0, math.nan, 3.0, 1.0, math.inf, 1.0, 2.0, 1.0]


def test_skipped_steps_are_the_healthy_steps_with_a_non_finite_gradient():
    assert hooks.count_skipped_steps(skip_config(0)) is None  # no dynamic scale, nothing to skip
    who = member()
    rows = run_ticks(hooks.count_skipped_steps(skip_config(200)), who, GRAD_NORMS)
    finite = np.isfinite(GRAD_NORMS)
    for step, row in rows.items():  # logged at log (4, 8), checkpoint (6) and last (10) steps
        if step in (4, 6, 8, 10):
            assert row["train/skipped_steps"] == (~finite[:step]).sum()
        else:
            assert "train/skipped_steps" not in row
    assert who.summary_fields["skipped_steps"] == 3


def test_a_resumed_run_goes_on_from_the_count_at_its_checkpoint():
    logged = [{"step": 4, "train/skipped_steps": 1}, {"step": 6, "train/skipped_steps": 2},
              {"step": 8, "train/skipped_steps": 9}]  # rows after the checkpoint: not counted
    who = member(start_step=6, logged=logged)
    run_ticks(hooks.count_skipped_steps(skip_config(200)), who, GRAD_NORMS[6:], first_step=7)
    assert who.summary_fields["skipped_steps"] == 2 + 1  # the inf at step 7


# --------------------------------------------------------------------------- the row


def test_the_report_row_sums_up_what_the_run_logged():
    rows = [{"step": 0, **{f"attn/layer{i}/head{h}/qk_clip_clipped_steps": 0.0
                           for i in range(2) for h in range(2)}},
            {"step": 25, "attn/layer0/head0/qk_clip_max_logit": 40.0,
             "attn/layer1/head1/qk_clip_max_logit": 61.0, "attn/layer0/softcap_past_knee": 0.01,
             "attn/layer1/softcap_past_knee": 0.03, "diag/z_loss_share": 0.002},
            {"step": 50, "attn/layer0/head0/qk_clip_max_logit": 55.0,
             "attn/layer0/softcap_past_knee": 0.02, "diag/z_loss_share": 0.001,
             "attn/layer0/head0/qk_clip_clipped_steps": 3.0,
             "attn/layer0/head1/qk_clip_clipped_steps": 1.0,
             "attn/layer1/head0/qk_clip_clipped_steps": 0.0,
             "attn/layer1/head1/qk_clip_clipped_steps": 5.0}]
    found = intervention_rows.acted_fields(rows, {"skipped_steps": 4})
    assert found == {"qk_clip_max_logit": 61.0, "qk_clip_clips": 9.0,
                     "qk_clip_clips/layer0": 4.0, "qk_clip_clips/layer1": 5.0,
                     "qk_clip_step_share": 5.0 / 50, "softcap_past_knee": 0.03,
                     "softcap_past_knee/layer0": 0.02, "softcap_past_knee/layer1": 0.03,
                     "z_loss_share": 0.002, "skipped_steps": 4}
    nothing_logged = [{"step": 0, "train/loss": 1.0}]
    assert intervention_rows.acted_fields(nothing_logged, {}) == {}


def test_a_run_logs_what_its_report_row_reads(tmp_path):
    """End to end: a tiny run that clips, with a z-loss and a dynamic loss scale; its row holds
    the counts, within what its steps allow (float32 never overflows: nothing skipped)."""
    config = tiny_config(**{"policy": "qk_clip:0.5", "train.z_loss": 1e-4,
                            "train.diag_every": 5, "train.loss_scale_period": 4})
    summary = train.train(config, tmp_path / "run")
    assert summary["status"] == "completed" and summary["skipped_steps"] == 0
    run = {"name": "run", "overrides": {}, "config": config.to_dict(), "summary": summary,
           "metrics": RunFiles(tmp_path / "run").read_metrics()}
    row = report.summarise_run(run)
    heads, layers, steps_run = config.model.num_heads, config.model.num_layers, 10
    assert 0 < row["qk_clip_clips"] <= heads * layers * steps_run
    assert row["qk_clip_clips"] == sum(row[f"qk_clip_clips/layer{i}"] for i in range(layers))
    assert 0 < row["qk_clip_step_share"] <= 1 and row["qk_clip_max_logit"] > 0.5
    assert 0 < row["z_loss_share"] < 0.01 and row["skipped_steps"] == 0
