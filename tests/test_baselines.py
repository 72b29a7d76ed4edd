"""Count baselines against counts done another way (Counter, log2 by hand), and MQAR's guesses
against a direct simulation and the laws they must obey."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from scale_ablation.analysis import baselines
from scale_ablation.data import sources as data


def lm_config(path, *, seq_len=8, batch_size=4, val_batches=3) -> dict:
    return {"data": {"source": f"text:{path}", "seq_len": seq_len, "val_batches": val_batches,
                     "mqar_num_pairs": 2, "mqar_vocab_size": 16},
            "train": {"batch_size": batch_size, "seed": 3}}


def scored_bytes(config: dict) -> list[tuple[int, int]]:
    """(previous byte, target byte) of every scored validation position."""
    source = data.make_source(baselines._data_config(config), seed=0)
    out = []
    for batch in source.val_batches(4, 8, 3):
        out += list(zip(batch.inputs.ravel().tolist(), batch.targets.ravel().tolist(),
                        strict=True))
    return out


def test_unigram_and_bigram_bits_per_byte_by_hand(tmp_path):
    text = ("the cat sat on the mat; " * 30 + "a dog ate the hat. " * 20).encode()
    (tmp_path / "corpus.txt").write_bytes(text)
    config = lm_config(tmp_path / "corpus.txt")
    cut = len(text) - int(len(text) * data.VALIDATION_FRACTION)  # single file: last 10% is val
    train = text[:cut]
    k = baselines.ADD_K
    unigram, bigram = Counter(train), Counter(itertools.pairwise(train))
    after = Counter(train[:-1])
    pairs = scored_bytes(config)
    want_unigram = -sum(math.log2((unigram[t] + k) / (len(train) + 256 * k)) for _, t in pairs)
    want_bigram = -sum(math.log2((bigram[(p, t)] + k) / (after[p] + 256 * k)) for p, t in pairs)
    got = baselines.baselines(config)
    assert got["unigram_bpb"] == pytest.approx(want_unigram / len(pairs), rel=1e-10)
    assert got["bigram_bpb"] == pytest.approx(want_bigram / len(pairs), rel=1e-10)
    assert got["bigram_bpb"] < got["unigram_bpb"]


def test_a_deterministic_corpus_has_a_near_zero_bigram_and_one_bit_unigram(tmp_path):
    # "abab...": each byte fixes the next (bigram -> 0 bits as counts grow); two equally
    # frequent bytes cost one bit each to a unigram model.
    (tmp_path / "ab.txt").write_bytes(b"ab" * 20000)
    got = baselines.baselines(lm_config(tmp_path / "ab.txt"))
    assert got["unigram_bpb"] == pytest.approx(1.0, abs=0.01)
    # The smoothing leaves 255·k of each row's ~N/2 + 256k mass to bytes never seen there.
    assert 0 < got["bigram_bpb"] < 0.02


def mqar_config(num_pairs: int, vocab: int = 32) -> dict:
    return {"data": {"source": "mqar", "seq_len": 32, "val_batches": 2,
                     "mqar_num_pairs": num_pairs, "mqar_vocab_size": vocab},
            "train": {"batch_size": 16, "seed": 0}}


def test_mqar_chance_and_context_guess():
    got = baselines.baselines(mqar_config(num_pairs=4))
    assert got["chance_accuracy"] == pytest.approx(2 / 32)
    # Simulate the guesser: draw uniformly from the distinct values seen, many times.
    source = data.MQAR(4, 32, seed=0)
    rng = np.random.default_rng(0)
    hits = trials = 0
    for batch in source.val_batches(16, 32, 2):
        for row, position in zip(*np.nonzero(batch.weights), strict=True):
            context = batch.inputs[row, : position + 1]
            seen = sorted({int(v) for v in context if 16 <= v < 32})
            guesses = rng.choice(seen, size=200)
            hits += int((guesses == batch.targets[row, position]).sum())
            trials += 200
    assert got["context_guess_accuracy"] == pytest.approx(hits / trials, abs=0.02)
    assert got["chance_accuracy"] < got["context_guess_accuracy"] < 1


def test_mqar_with_one_pair_is_guessed_from_context_every_time():
    got = baselines.baselines(mqar_config(num_pairs=1))
    assert got["context_guess_accuracy"] == 1.0
