"""The train and eval programs against hand counts: the loss and z-loss, bits per byte, weighted
accuracy, and a diverged step that leaves the state bitwise as it was."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_model import tiny_config

from scale_ablation.training import run_setup, steps
from scale_ablation.training.evaluation import Evaluator
from scale_ablation.training.optim import OptimizerSettings, make_optimizer

CONFIG = {"model.num_layers": 1, "train.batch_size": 4, "data.val_batches": 2}


def numpy_nll(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-position -log softmax(logits)[target] and log Z, in float64."""
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return log_z - picked, log_z


@pytest.fixture(scope="module")
def fresh():
    config = tiny_config(**CONFIG)
    graphdef, state = run_setup.init_state(config)
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s["params"], s["rest"])(x)[0])
    return config, graphdef, state, forward


def test_cross_entropy_and_z_loss_by_hand():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 3, 5)).astype(np.float32) * 3
    targets = rng.integers(0, 5, (2, 3))
    weights = np.array([[1, 0, 1], [0.5, 1, 0]], np.float32)
    nll, log_z = numpy_nll(logits, targets)
    expected = (nll * weights).sum() / weights.sum()
    expected_z = expected + 1e-2 * (log_z**2 * weights).sum() / weights.sum()
    loss, with_z = steps.cross_entropy(jnp.asarray(logits), jnp.asarray(targets),
                                       jnp.asarray(weights), 1e-2)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(with_z) == pytest.approx(expected_z, rel=1e-5)


def test_val_bpb_is_the_hand_counted_loss_in_bits(fresh, tmp_path):
    config, _, _, forward = fresh
    run = run_setup.prepare(config, tmp_path / "run")
    row = Evaluator(run).evaluate(run.state)
    nll_sum = weight_sum = correct = 0.0
    for batch in run.source.val_batches(config.train.batch_size, config.data.seq_len,
                                        config.data.val_batches):
        logits = np.asarray(forward(run.state, jnp.asarray(batch.inputs)))
        nll, _ = numpy_nll(logits, np.asarray(batch.targets))
        weights = np.asarray(batch.weights, np.float64)
        nll_sum += (nll * weights).sum()
        weight_sum += weights.sum()
        correct += ((logits.argmax(-1) == batch.targets) * weights).sum()
    nats = nll_sum / weight_sum
    assert row["val/loss"] == pytest.approx(nats, rel=1e-5)
    assert row["val/bpb"] == pytest.approx(nats / math.log(2), rel=1e-5)
    assert row["val/accuracy"] == pytest.approx(correct / weight_sum, abs=1e-9)


def test_eval_accuracy_counts_weighted_positions_only(fresh):
    config, graphdef, state, forward = fresh
    rng = np.random.default_rng(1)
    inputs = rng.integers(0, 256, (2, config.data.seq_len)).astype(np.int32)
    predicted = np.asarray(forward(state, jnp.asarray(inputs))).argmax(-1)
    # Every unweighted position predicted right, one weighted position in three: the
    # unweighted accuracy is far above the weighted one (an MQAR batch scores recall only).
    weights = (np.arange(inputs.size).reshape(inputs.shape) % 2).astype(np.float32)
    wrong = (predicted + 1) % 256
    right_when_weighted = (np.arange(inputs.size).reshape(inputs.shape) % 3) == 0
    targets = np.where((weights == 0) | right_when_weighted, predicted, wrong).astype(np.int32)
    weighted = ((predicted == targets) * weights).sum() / weights.sum()
    unweighted = (predicted == targets).mean()
    assert abs(weighted - unweighted) > 0.2
    batch = {"inputs": jnp.asarray(inputs), "targets": jnp.asarray(targets),
             "weights": jnp.asarray(weights)}
    loss_sum, weight, correct = (np.asarray(a) for a in
                                 jax.jit(steps.make_eval_step(graphdef))(state, batch))
    assert loss_sum.shape == weight.shape == correct.shape == (inputs.shape[1],)  # per position
    np.testing.assert_array_equal(weight, weights.sum(0))
    assert correct.sum() / weight.sum() == pytest.approx(weighted, abs=1e-9)
    nll, _ = numpy_nll(np.asarray(forward(state, jnp.asarray(inputs))), targets)
    np.testing.assert_allclose(loss_sum, (nll * weights).sum(0), rtol=1e-5)


def test_loss_beyond_the_training_length_by_hand(tmp_path):
    """val/*_beyond@L against the model's own per-position losses on the same validation
    batches, averaged by hand over positions n..L-1; @L over all L; the degradation is the
    difference of the two bits per byte."""
    config = tiny_config(**CONFIG, **{"model.positions": "rotary"})
    n = config.data.seq_len
    config.train.eval_seq_lens = (n, 3 * n)  # n itself: no positions beyond, no _beyond key
    run = run_setup.prepare(config, tmp_path / "run")
    eval_program = steps.programs(run.graphdef, run.optimizer, 0.0).eval
    compiled_before = eval_program._cache_size()  # the cache is shared by the whole process
    row = Evaluator(run).evaluate(run.state)
    forward = jax.jit(lambda s, x: nnx.merge(run.graphdef, s["params"], s["rest"])(x)[0])
    nll = np.concatenate([
        numpy_nll(np.asarray(forward(run.state, jnp.asarray(b.inputs))), np.asarray(b.targets))[0]
        for b in run.source.val_batches(config.train.batch_size, 3 * n, config.data.val_batches)])
    assert nll.shape == (config.train.batch_size * config.data.val_batches, 3 * n)
    beyond, everything = nll[:, n:].mean(), nll.mean()
    assert abs(beyond - everything) > 1e-4  # the two averages differ, so the test can tell
    assert row[f"val/loss_beyond@{3 * n}"] == pytest.approx(beyond, rel=1e-5)
    assert row[f"val/bpb_beyond@{3 * n}"] == pytest.approx(beyond / math.log(2), rel=1e-5)
    assert row[f"val/loss@{3 * n}"] == pytest.approx(everything, rel=1e-5)
    # A difference of two averages: its error is theirs (rel 1e-5 of each), not 1e-5 of itself.
    assert row[f"val/bpb_degradation@{3 * n}"] == pytest.approx(
        (beyond - row["val/loss"]) / math.log(2), abs=1e-5 * beyond / math.log(2))
    assert f"val/loss_beyond@{n}" not in row and f"val/loss@{n}" in row
    # At most one eval program per sequence length (n, 3n): the positions beyond n cost none.
    assert eval_program._cache_size() - compiled_before <= 2


def test_the_longer_lengths_on_the_test_split_by_hand(tmp_path):
    """test/*_beyond@L against the model's own per-position losses on the test batches of
    length L, averaged by hand over the real rows' positions n..L-1: ceil(test_bytes / L)
    windows, none of them a validation window at L; the degradation is taken from the test
    split's bits per byte at n, so no validation byte enters a test number."""
    test_bytes = 1000
    config = tiny_config(**CONFIG, **{"model.positions": "rotary", "data.test_bytes": test_bytes})
    n, batch_size = config.data.seq_len, config.train.batch_size
    config.train.eval_seq_lens = (3 * n,)
    run = run_setup.prepare(config, tmp_path / "run")
    row = Evaluator(run).evaluate_test(run.state)
    validation = [(batch_size, length, config.data.val_batches) for length in (n, 3 * n)]
    test = run.source.test_batches(batch_size, 3 * n, math.ceil(test_bytes / (3 * n)),
                                   avoid=validation)
    real = np.concatenate([b.weights[:, 0] > 0 for b in test])
    assert real.sum() == math.ceil(test_bytes / (3 * n))
    windows = np.concatenate([b.inputs for b in test])[real]
    val_windows = np.concatenate([b.inputs for b in run.source.val_batches(*validation[1])])
    assert not (windows[:, None, :] == val_windows[None, :, :]).all(-1).any()
    forward = jax.jit(lambda s, x: nnx.merge(run.graphdef, s["params"], s["rest"])(x)[0])
    nll = np.concatenate([
        numpy_nll(np.asarray(forward(run.state, jnp.asarray(b.inputs))), np.asarray(b.targets))[0]
        for b in test])[real]  # [windows, 3n]
    beyond = nll[:, n:].mean()
    assert row[f"test/loss_beyond@{3 * n}"] == pytest.approx(beyond, rel=1e-5)
    assert row[f"test/loss@{3 * n}"] == pytest.approx(nll.mean(), rel=1e-5)
    assert row[f"test/bpb_degradation@{3 * n}"] == pytest.approx(
        (beyond - row["test/loss"]) / math.log(2), abs=1e-5 * beyond / math.log(2))
    assert not any(key.startswith("val/") for key in row)


def batch_of(config, seed, poison: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, (config.train.batch_size, config.data.seq_len + 1))
    weights = np.ones(tokens[:, 1:].shape, np.float32)
    if poison:  # one NaN weight: a non-finite loss and gradient, as a diverged run produces
        weights[0, 0] = np.nan
    return {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
            "targets": jnp.asarray(tokens[:, 1:], jnp.int32), "weights": jnp.asarray(weights)}


def assert_bitwise_equal(a, b) -> None:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        x, y = np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
                          else x), np.asarray(y)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_a_non_finite_step_leaves_the_state_bitwise_unchanged(fresh):
    config, graphdef, state, _ = fresh
    step = jax.jit(steps.make_train_step(graphdef, make_optimizer(config), 0.0))
    key = steps.dropout_key(0, 0)
    good, metrics = step(state, batch_of(config, 0), key)
    assert bool(metrics["train/finite"]) and int(good["step"]) == 1
    before = jax.device_get(good)
    after, metrics = step(good, batch_of(config, 1, poison=True), key)
    assert not bool(metrics["train/finite"])
    assert_bitwise_equal(jax.device_get(after), before)


@pytest.mark.parametrize("backend", ["cpu", "gpu"], ids=["lax_map", "vmap"])
def test_a_diverged_member_is_frozen_and_its_neighbour_trains_on(fresh, backend):
    config, graphdef, state, _ = fresh
    solo = steps.make_train_step(graphdef, make_optimizer(config), 0.0)
    members = jax.jit(steps.over_members(solo, backend))
    stack = lambda *trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees)  # noqa: E731
    batches = stack(batch_of(config, 2), batch_of(config, 3, poison=True))
    keys = jnp.stack([steps.dropout_key(0, 0), steps.dropout_key(1, 0)])
    after, metrics = members(stack(state, state), batches, keys)
    assert np.asarray(metrics["train/finite"]).tolist() == [True, False]
    first, second = (jax.tree.map(lambda x, i=i: x[i], after) for i in (0, 1))
    assert_bitwise_equal(jax.device_get(second), jax.device_get(state))
    expected, _ = jax.jit(solo)(state, batch_of(config, 2), steps.dropout_key(0, 0))
    for got, want in zip(jax.tree.leaves(first), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert int(first["step"]) == 1 and int(second["step"]) == 0


def test_the_step_scales_its_update_by_the_state_lr(fresh):
    """Adam's step does not depend on the learning rate, so doubling the state's lr doubles
    every parameter's change (the peak lr is applied outside the optimiser)."""
    config, graphdef, state, _ = fresh
    settings = OptimizerSettings(steps=10, warmup_steps=0, grad_clip=1.0, weight_decay=0.1)
    step = jax.jit(steps.make_train_step(graphdef, make_optimizer(settings), 0.0))
    batch, key = batch_of(config, 4), steps.dropout_key(0, 0)
    changes = []
    for lr in (1e-3, 2e-3):
        after, _ = step({**state, "lr": jnp.float32(lr)}, batch, key)
        changes.append(jax.tree.map(lambda new, old: np.asarray(new, np.float64) - np.asarray(old),
                                    after["params"], state["params"]))
    for small, double in zip(jax.tree.leaves(changes[0]), jax.tree.leaves(changes[1]), strict=True):
        np.testing.assert_allclose(double, 2 * small, rtol=1e-3, atol=1e-6)
    assert max(np.abs(leaf).max() for leaf in jax.tree.leaves(changes[0])) > 0


def test_the_seeded_step_draws_the_host_key_of_its_step_and_returns_every_metric():
    """The loop's step derives the dropout key on the device from the seed and the state's step
    counter: a second step (counter 1) must give, bit for bit, the state and metrics of the
    plain step given the host's key of step 1 (with dropout on, so the key matters)."""
    config = tiny_config(**CONFIG, **{"model.attention_dropout": 0.5})
    graphdef, state = run_setup.init_state(config)
    plain = steps.make_train_step(graphdef, make_optimizer(config), 0.0)
    state, _ = jax.jit(plain)(state, batch_of(config, 0), steps.dropout_key(7, 0))
    want_state, want_metrics = jax.jit(plain)(state, batch_of(config, 1), steps.dropout_key(7, 1))
    got_state, got_metrics = jax.jit(steps.seeded(plain))(state, batch_of(config, 1),
                                                          jnp.int32(7))
    assert_bitwise_equal(jax.device_get(got_state), jax.device_get(want_state))
    assert got_metrics.shape == (len(steps.TRAIN_METRICS),)
    for name, value in zip(steps.TRAIN_METRICS, np.asarray(got_metrics), strict=True):
        assert value == np.float32(want_metrics[name]), name
    _, other_key = jax.jit(plain)(state, batch_of(config, 1), steps.dropout_key(7, 2))
    assert other_key["train/loss"] != want_metrics["train/loss"]  # the key does matter here


def test_a_chunk_of_steps_is_its_steps_one_by_one_and_stops_at_a_non_finite_one(fresh):
    config, graphdef, state, _ = fresh
    step = steps.seeded(steps.make_train_step(graphdef, make_optimizer(config), 0.0))
    chunk = jax.jit(steps.chunked(step))
    batches = [batch_of(config, 10), batch_of(config, 11), batch_of(config, 12)]
    stack = lambda trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees)  # noqa: E731
    want, want_metrics = state, []
    for batch in batches:
        want, metrics = jax.jit(step)(want, batch, jnp.int32(3))
        want_metrics.append(np.asarray(metrics))
    got, got_metrics = chunk(state, stack(batches), jnp.int32(3))
    assert_bitwise_equal(jax.device_get(got), jax.device_get(want))
    assert np.array_equal(np.asarray(got_metrics), np.stack(want_metrics))  # (n, M)
    after_first, _ = jax.jit(step)(state, batches[0], jnp.int32(3))
    poisoned = [batches[0], batch_of(config, 11, poison=True), batches[2]]
    got, metrics = chunk(state, stack(poisoned), jnp.int32(3))
    finite = np.asarray(metrics)[:, steps.TRAIN_METRICS.index("train/finite")]
    assert finite.tolist() == [1.0, 0.0, 1.0]  # the third step alone would be finite again
    assert_bitwise_equal(jax.device_get(got), jax.device_get(after_first))
