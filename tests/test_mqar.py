
"""MQAR as Zoology defines it: the sequences re-parsed and checked against the task's definition,
the query-slot law against the stated power law, and model-free guessers at chance.

Statistical checks draw from fixed seeds, so they are deterministic; their tolerances are
bounds that a correct generator exceeds with probability < 1e-3 (DKW for a CDF, 4.5 standard
errors for a binomial proportion), and each is shown to reject a generator that is wrong in the
way it guards against.
"""

import itertools
import math

import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from scale_ablation.analysis import baselines
from scale_ablation.data import heldout, windows
from scale_ablation.data import sources as data
from scale_ablation.errors import ConfigError
from scale_ablation.model.build import build_model
from scale_ablation.training import run_config, train
from scale_ablation.training.run_config import validate


def source(num_pairs: int = 8, vocab_size: int = 64, power_a: float = 0.01) -> data.MQAR:
    return data.MQAR(num_pairs, vocab_size, seed=3, power_a=power_a)


def parse(inputs: np.ndarray, num_pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, values) of one row: its first 2 * num_pairs tokens, alternating."""
    return inputs[0 : 2 * num_pairs : 2], inputs[1 : 2 * num_pairs : 2]


def within_binomial(hits: int, trials: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(hits / trials - p) <= sigmas * math.sqrt(p * (1 - p) / trials)


# --- the sequences ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_pairs,vocab_size,seq_len", [(8, 64, 64), (4, 8192, 64),
                                                          (1, 4, 4), (16, 512, 100)])
def test_pairs_then_each_key_queried_once_for_its_value(num_pairs, vocab_size, seq_len):
    mqar = source(num_pairs, vocab_size)
    batch = mqar.train_batch(2, 32, seq_len)
    half = vocab_size // 2
    for inputs, targets, weights in zip(batch.inputs, batch.targets, batch.weights, strict=True):
        keys, values = parse(inputs, num_pairs)
        # Disjoint halves (0 is the filler, never a key); distinct keys and distinct values.
        assert np.all((keys >= 1) & (keys < half))
        assert np.all((values >= half) & (values < vocab_size))
        assert len(set(keys.tolist())) == len(set(values.tolist())) == num_pairs
        (queries,) = np.nonzero(weights)
        # One query per key, at the first token of a 2-token slot after the pairs.
        assert sorted(inputs[queries].tolist()) == sorted(keys.tolist())
        assert np.all(queries >= 2 * num_pairs) and np.all((queries - 2 * num_pairs) % 2 == 0)
        value_of = dict(zip(keys.tolist(), values.tolist(), strict=True))
        assert [targets[q] for q in queries] == [value_of[inputs[q]] for q in queries]
        # Everything else in the query region is filler, and only queries are scored.
        rest = np.setdiff1d(np.arange(2 * num_pairs, seq_len), queries)
        assert np.all(inputs[rest] == data.MQAR.FILLER)
        assert set(np.unique(weights)) == {0.0, 1.0} and weights.sum() == num_pairs


def test_answers_never_appear_in_the_input():
    mqar = source(8, 64)
    batch = mqar.train_batch(0, 256, 64)
    for inputs, targets, weights in zip(batch.inputs, batch.targets, batch.weights, strict=True):
        shown = inputs[inputs >= 32]  # every value id in the input, with repeats
        # Exactly the pairs' values, each once: no answer is ever written after its query.
        assert sorted(shown.tolist()) == sorted(parse(inputs, 8)[1].tolist())
        assert np.all(inputs[2 * 8 :] < 32)
        (queries,) = np.nonzero(weights)
        assert not np.isin(targets[queries], inputs[2 * 8 :]).any()


def mqar_run(**data_fields):
    """The tiny test run on MQAR (8 pairs, 64 ids, seq 64) with `data_fields` on top
    (`mqar_power_a` is an optional field, set as experiments/mqar.py sets it)."""
    fields = {"source": "mqar", "seq_len": 64, "mqar_vocab_size": 64, "mqar_num_pairs": 8,
              **data_fields}
    run = tiny_config()
    run.data.update(fields)
    return run


def test_the_model_vocabulary_follows_the_mqar_vocabulary():
    run = mqar_run(mqar_vocab_size=8192, mqar_num_pairs=4)
    model = build_model(run_config.model_config(run), nnx.Rngs(params=0))
    assert model.embed.embedding[...].shape == (8192, run.model.d_model)
    run.data.source = "shakespeare"
    assert run_config.model_config(run).vocab_size == data.VOCAB_SIZE == 256


@pytest.mark.parametrize("field,value,problem", [
    ("mqar_vocab_size", 8194, r"data.mqar_vocab_size must be an integer in \[4, 8192\]"),
    ("mqar_vocab_size", 63, "data.mqar_vocab_size must be an even integer in 4..8192"),
    ("mqar_num_pairs", 32, r"data.mqar_num_pairs must be in 1\.\.31"),
    ("mqar_num_pairs", 0, "data.mqar_num_pairs must be an integer >= 1"),
    ("mqar_num_pairs", 20, "data.seq_len 64 is too short .* need seq_len >= 80"),
    ("mqar_power_a", 0.0, "data.mqar_power_a must be a positive finite number"),
])
def test_bad_mqar_settings_are_one_line_config_errors(field, value, problem):
    with pytest.raises(ConfigError, match=problem) as error:
        validate(mqar_run(**{field: value}))
    assert "\n" not in str(error.value)


# --- the query slots: the power law, dealt to the pairs at random --------------------------------


def law(power_a: float, num_slots: int) -> np.ndarray:
    """Zoology's stated law of one draw, written out independently: ∝ (s + 1)^(a - 1)."""
    weights = np.array([(s + 1) ** (power_a - 1) for s in range(num_slots)])
    return weights / weights.sum()


def slots(batch: data.Batch, num_pairs: int) -> np.ndarray:
    """[B, N] query slot of pair i (the slot index in the query region)."""
    keys = batch.inputs[:, 0 : 2 * num_pairs : 2]
    out = np.empty_like(keys)
    for row, (inputs, weights) in enumerate(zip(batch.inputs, batch.weights, strict=True)):
        (queries,) = np.nonzero(weights)
        slot_of = {int(inputs[q]): (q - 2 * num_pairs) // 2 for q in queries}
        out[row] = [slot_of[int(k)] for k in keys[row]]
    return out


@pytest.mark.parametrize("power_a", [0.01, 0.5])
def test_one_query_slot_follows_the_power_law(power_a):
    # One pair: its slot is a single draw from the law. DKW: sup |F_n - F| <= eps with
    # probability >= 1 - 1e-3; the uniform law (Zoology's power_a = 1) must lie outside.
    mqar, seq_len, rows = source(1, 64, power_a), 62, 4000
    drawn = np.concatenate([slots(mqar.train_batch(step, rows, seq_len), 1)[:, 0]
                            for step in range(5)])
    expected = np.cumsum(law(power_a, 30))
    empirical = np.array([(drawn <= s).mean() for s in range(30)])
    eps = math.sqrt(math.log(2 / 1e-3) / (2 * drawn.size))
    assert np.abs(empirical - expected).max() <= eps
    assert np.abs(empirical - np.cumsum(np.full(30, 1 / 30))).max() > eps


def test_several_query_slots_are_successive_draws_without_replacement():
    # Exact inclusion probabilities of each slot under successive weighted draws without
    # replacement, by enumerating every ordered draw: 5 slots, 2 pairs.
    num_pairs, num_slots, power_a = 2, 5, 0.3
    p = law(power_a, num_slots)
    inclusion = np.zeros(num_slots)
    for first, second in itertools.permutations(range(num_slots), 2):
        probability = p[first] * p[second] / (1 - p[first])
        inclusion[[first, second]] += probability
    mqar, seq_len = source(num_pairs, 64, power_a), 2 * num_pairs + 2 * num_slots
    drawn = np.concatenate([slots(mqar.train_batch(s, 2000, seq_len), num_pairs) for s in range(5)])
    for slot in range(num_slots):
        hits = int((drawn == slot).any(axis=1).sum())
        assert within_binomial(hits, len(drawn), inclusion[slot]), slot
    # Not the independent (with replacement) law: it would include slot 0 less often.
    assert not within_binomial(int((drawn == 0).any(axis=1).sum()), len(drawn),
                               1 - (1 - p[0]) ** num_pairs)


# --- model-free guessers are at chance ----------------------------------------------------------


def rule_out_guess(inputs: np.ndarray, position: int, half: int,
                   rng: np.random.Generator) -> int:
    """Guess uniformly among the value ids the input has shown up to `position`, ruling out
    any shown twice (a value shown again has been revealed as an answer)."""
    shown = inputs[: position + 1]
    shown = shown[shown >= half]
    ids, counts = np.unique(shown, return_counts=True)
    candidates = ids[counts == 1]
    return int(rng.choice(candidates if candidates.size else ids))


def guess_accuracy(batches: list[data.Batch], half: int) -> tuple[int, int]:
    rng = np.random.default_rng(0)
    hits = trials = 0
    for batch in batches:
        for row, position in zip(*np.nonzero(batch.weights), strict=True):
            guess = rule_out_guess(batch.inputs[row], position, half, rng)
            hits += guess == batch.targets[row, position]
            trials += 1
    return hits, trials


def reveal_answers(batch: data.Batch) -> data.Batch:
    """The old task's leak: each answer written into the input right after its query."""
    inputs = batch.inputs.copy()
    rows, queries = np.nonzero(batch.weights)
    inputs[rows, queries + 1] = batch.targets[rows, queries]
    return data.Batch(inputs, batch.targets, batch.weights)


def test_ruling_out_answered_values_is_at_chance_unless_answers_are_revealed():
    num_pairs, vocab = 8, 64
    mqar = source(num_pairs, vocab)
    batches = mqar.val_batches(64, 64, 8)  # 4096 queries
    hits, trials = guess_accuracy(batches, vocab // 2)
    expected = baselines.context_guess_accuracy(mqar)
    assert expected == 1 / num_pairs
    assert within_binomial(hits, trials, expected)
    # The same guesser on the same sequences with their answers revealed: H_N / N = 0.34.
    leaky_hits, leaky_trials = guess_accuracy([reveal_answers(b) for b in batches], vocab // 2)
    assert not within_binomial(leaky_hits, leaky_trials, expected)
    harmonic = sum(1 / k for k in range(1, num_pairs + 1)) / num_pairs
    assert within_binomial(leaky_hits, leaky_trials, harmonic)


def test_query_order_says_nothing_about_which_pair_is_asked():
    # Answer the j-th query with the j-th pair's value. Zoology deals the i-th slot draw to the
    # i-th pair, which puts this at 0.28 for 4 pairs in 64 tokens; dealt at random, it is 1/N.
    num_pairs = 4
    mqar = source(num_pairs, 64)
    batch = mqar.train_batch(0, 10_000, 64)
    order = slots(batch, num_pairs).argsort(axis=1).argsort(axis=1)  # query rank of pair i
    hits = int((order == np.arange(num_pairs)).sum())
    assert within_binomial(hits, order.size, 1 / num_pairs)


# --- accuracy and the baselines' numbers --------------------------------------------------------


def test_recall_accuracy_counts_query_positions_only():
    batch = source(8, 64).train_batch(0, 16, 64)
    queries = batch.weights > 0
    only_queries = np.where(queries, batch.targets, -1)
    all_but_queries = np.where(queries, -1, batch.targets)
    assert data.recall_accuracy(only_queries, batch) == 1.0
    assert data.recall_accuracy(all_but_queries, batch) == 0.0


def test_baselines_of_a_run_config():
    config = {"data": {"source": "mqar", "seq_len": 64, "val_batches": 2, "mqar_num_pairs": 4,
                       "mqar_vocab_size": 8192}, "train": {"batch_size": 16, "seed": 0}}
    got = baselines.baselines(config)
    assert got == {"chance_accuracy": 2 / 8192, "context_guess_accuracy": 1 / 4}


# --- the test split: fresh sequences ------------------------------------------------------------


def generator_state(rng: np.random.Generator) -> tuple[int, ...]:
    return tuple(rng.bit_generator.seed_seq.generate_state(4))


def test_test_generators_are_no_training_or_validation_generator():
    """For the train seeds that would collide with a test generator seeded plainly
    [TEST_SEED, i] (TEST_SEED itself, or TEST_SEED + i * 2**32 as two 32-bit words), and for the
    validation generators, the test generators' states differ, and so do the sequences."""
    tests = {generator_state(heldout.heldout_rng(i)) for i in range(16)}
    seeds = (0, 1, data.VALIDATION_SEED, heldout.TEST_SEED, heldout.TEST_SEED + 2**32, 2**96 + 5)
    trains = {generator_state(windows.train_rng(seed, step)) for seed in seeds for step in range(16)}
    vals = {generator_state(windows.val_rng(i)) for i in range(16)}
    assert len(tests) == 16 and tests.isdisjoint(trains | vals)
    # The guard is needed: a plain [TEST_SEED, i] is the train generator of seed TEST_SEED.
    assert generator_state(np.random.default_rng([heldout.TEST_SEED, 3])) in trains
    mqar = data.MQAR(4, 64, seed=heldout.TEST_SEED)
    test, val = mqar.test_batches(8, 32, 32), mqar.val_batches(8, 32, 4)
    for i, batch in enumerate(test):
        assert not np.array_equal(batch.inputs, mqar.train_batch(i, 8, 32).inputs)
        assert not np.array_equal(batch.inputs, val[i].inputs)


def test_the_test_set_is_fixed_and_padded_to_whole_batches():
    first = data.MQAR(4, 64, seed=0).test_batches(8, 32, 20)
    again = data.MQAR(4, 64, seed=9).test_batches(8, 32, 20)
    assert len(first) == 3
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.inputs, b.inputs)
    weights = np.concatenate([b.weights for b in first])  # [24, 32]
    assert weights.sum(axis=1).tolist() == [4.0] * 20 + [0.0] * 4


def test_a_run_reports_test_accuracy_on_its_fresh_sequences(tmp_path):
    config = tiny_config(**{"data.source": "mqar", "data.mqar_num_pairs": 4,
                            "data.mqar_vocab_size": 64})
    summary = train.train(config, tmp_path / "run", progress=False)
    windows = math.ceil(config.data.test_bytes / config.data.seq_len)
    assert summary["test_targets"] == windows * 4  # the queries of the test sequences
    assert 0 <= summary["test_accuracy"] <= 1 and math.isfinite(summary["test_loss"])
