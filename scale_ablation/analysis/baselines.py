"""What a model must beat: count-based byte models, and MQAR's chance and context guessing.

Language modelling: unigram and bigram models counted on the training split with add-k
smoothing (k = ADD_K on every one of the 256 byte values, or of the 256 next bytes of each
previous byte), scored in bits per byte on exactly the validation targets the model is scored on:
the windows `source.val_batches(train.batch_size, data.seq_len, data.val_batches)`, weighted as
the model's loss is. The bigram's context is the position's input byte, which is the byte before
the target in the corpus, so it sees no more than the model does.

MQAR (`data.MQAR`): `chance` guesses uniformly among the V/2 value ids [V/2, V): 2/V.
`context_guess` guesses uniformly among the values the input has shown up to the query, after
ruling out any it has revealed as an answer. The generator fixes what that is: the input shows
exactly the N values of the pairs, each once, and never an answer (queries are followed by
filler), and the keys are dealt to the query slots in a random order, so nothing but recall
tells the N values apart: 1/N on every query. tests/test_baselines.py checks it against a
simulated guesser.
"""

from __future__ import annotations

import functools
import json
import math
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from scale_ablation.data import sources as data_lib

ADD_K = 0.5  # add-k smoothing of both count models (k = 1/2: Jeffreys / Krichevsky–Trofimov)


def _data_config(config: Mapping[str, Any]) -> types.SimpleNamespace:
    return types.SimpleNamespace(**config["data"])


def _validation(config: Mapping[str, Any]) -> tuple[Any, list[data_lib.Batch]]:
    source = data_lib.make_source(_data_config(config), seed=config["train"]["seed"])
    batches = source.val_batches(config["train"]["batch_size"], config["data"]["seq_len"],
                                 config["data"]["val_batches"])
    return source, batches


def unigram_bits(train: np.ndarray, targets: np.ndarray, weights: np.ndarray,
                 k: float = ADD_K) -> float:
    """Weighted mean −log2 p(target) under add-k smoothed byte frequencies of `train`."""
    counts = np.bincount(train, minlength=data_lib.VOCAB_SIZE).astype(np.float64)  # [256]
    probs = (counts + k) / (counts.sum() + k * data_lib.VOCAB_SIZE)
    return float(-(np.log2(probs[targets]) * weights).sum() / weights.sum())


def bigram_bits(train: np.ndarray, inputs: np.ndarray, targets: np.ndarray,
                weights: np.ndarray, k: float = ADD_K) -> float:
    """Weighted mean −log2 p(target | input byte) under add-k smoothed pair counts of `train`."""
    vocab = data_lib.VOCAB_SIZE
    train = train.astype(np.int64)
    pairs = np.bincount(train[:-1] * vocab + train[1:], minlength=vocab * vocab)
    pairs = pairs.reshape(vocab, vocab).astype(np.float64)  # [previous byte, next byte]
    probs = (pairs + k) / (pairs.sum(axis=1, keepdims=True) + k * vocab)
    return float(-(np.log2(probs[inputs, targets]) * weights).sum() / weights.sum())


def _json_key(config: Mapping[str, Any]) -> str:
    fields = {"data": config["data"], "batch_size": config["train"]["batch_size"],
              "seed": 0}  # no baseline depends on the train seed
    return json.dumps(fields, sort_keys=True, default=str)


def baselines(config: Mapping[str, Any]) -> dict[str, float]:
    """The baselines of a run's config (as in its config.json), by name:
    LM: unigram_bpb, bigram_bpb; MQAR: chance_accuracy, context_guess_accuracy."""
    # Runs of a sweep share their data settings: count once per distinct setting.
    return dict(_cached(_json_key(config)))


@functools.lru_cache(maxsize=16)
def _cached(key: str) -> tuple[tuple[str, float], ...]:
    fields = json.loads(key)
    config = {"data": fields["data"],
              "train": {"batch_size": fields["batch_size"], "seed": fields["seed"]}}
    if config["data"]["source"] == "mqar":
        source = data_lib.mqar_source(_data_config(config), seed=0)
        return (("chance_accuracy", chance_accuracy(source)),
                ("context_guess_accuracy", context_guess_accuracy(source)))
    source, batches = _validation(config)
    inputs, targets, weights = (np.concatenate([getattr(b, name) for b in batches])
                                for name in ("inputs", "targets", "weights"))
    return (("unigram_bpb", unigram_bits(source.train, targets, weights)),
            ("bigram_bpb", bigram_bits(source.train, inputs, targets, weights)))


def chance_accuracy(source: data_lib.MQAR) -> float:
    """Expected accuracy of a uniform guess among the value ids."""
    return 1 / source.num_values


def context_guess_accuracy(source: data_lib.MQAR) -> float:
    """Expected accuracy of a uniform guess among the values shown in the input and not yet
    revealed as answers: the N values of the pairs (see the module docstring), so 1/N."""
    return 1 / source.num_pairs


def bits_to_nats(bits: float) -> float:
    return bits * math.log(2)
