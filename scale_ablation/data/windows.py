"""Byte windows and batches, shared by every byte source: the `Batch`, the `DataSource`
protocol, which rows of a batch are this process's, the seeded starts of training and
validation windows, and test batches cut from held-out bytes (`heldout`).

Every batch is a pure function of (seed, step) or (batch index): a resume reads exactly the
batches an uninterrupted run reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from scale_ablation.data import heldout

VALIDATION_SEED = 0x5EED_0FF  # validation batch i: [VALIDATION_SEED, i]


@dataclasses.dataclass(frozen=True)
class Batch:
    inputs: np.ndarray  # [B, T] int32 byte ids
    targets: np.ndarray  # [B, T] int32 next-byte ids
    weights: np.ndarray  # [B, T] float32, 1 where the loss counts (MQAR: answer positions only)


# A validation set as a run reads it: (batch_size, seq_len, num_batches) of `val_batches`.
ValidationSet = tuple[int, int, int]


class DataSource(Protocol):
    name: str

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, process_index: int = 0,
                    process_count: int = 1) -> Batch:
        """This process's rows [i*B/P, (i+1)*B/P) of the global batch for `step`."""
        ...

    def val_batches(self, batch_size: int, seq_len: int, num_batches: int) -> list[Batch]:
        """The fixed validation set: identical on every call and for every train seed."""
        ...

    def test_batches(self, batch_size: int, seq_len: int, num_windows: int, *,
                     avoid: Sequence[ValidationSet] = ()) -> list[Batch]:
        """The fixed test set: `num_windows` sequences (fewer if the held-out text has fewer
        outside the validation windows of `avoid`) in batches of `batch_size`, the last one
        padded with rows of weight 0; identical on every call and for every train seed."""
        ...


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is not in [0, {process_count})")
    if batch_size % process_count:
        raise ValueError(
            f"batch_size {batch_size} does not divide by process_count {process_count}"
        )
    rows = batch_size // process_count
    return slice(process_index * rows, (process_index + 1) * rows)


def process_share(batch: Batch, process_index: int, process_count: int) -> Batch:
    """This process's rows of a global batch: in a multi-host run each process feeds its own."""
    rows = process_rows(batch.inputs.shape[0], process_index, process_count)
    return Batch(batch.inputs[rows], batch.targets[rows], batch.weights[rows])


def train_rng(seed: int, step: int) -> np.random.Generator:
    if seed < 0 or step < 0:
        raise ValueError(f"seed and step must be >= 0, got seed {seed}, step {step}")
    return np.random.default_rng([seed, step])


def val_rng(batch_index: int) -> np.random.Generator:
    # One generator per validation batch: asking for fewer batches gives a prefix of the set.
    return np.random.default_rng([VALIDATION_SEED, batch_index])


def val_starts(size: int, batch_size: int, seq_len: int, batch_index: int) -> np.ndarray:
    """[B] starts of validation batch `batch_index`'s windows in `size` held-out bytes."""
    return val_rng(batch_index).integers(0, size - seq_len, size=batch_size)


# --- byte corpora -------------------------------------------------------------------------------


def cut_windows(corpus: np.ndarray, starts: np.ndarray, seq_len: int) -> Batch:
    windows = corpus[starts[:, None] + np.arange(seq_len + 1)]  # (B, T+1) uint8
    windows = windows.astype(np.int32)
    return Batch(
        inputs=windows[:, :-1],
        targets=windows[:, 1:],
        weights=np.ones((len(starts), seq_len), np.float32),
    )


def held_out_batches(held_out: np.ndarray, batch_size: int, seq_len: int, num_windows: int,
                     avoid: Sequence[ValidationSet] = ()) -> list[Batch]:
    """The test batches of held-out bytes whose validation windows are `avoid`
    (`heldout.tile_starts`): [B, T] each, rows past the last tile weighted 0."""
    spans = [(np.concatenate([val_starts(held_out.size, b, length, i) for i in range(n)]),
              length)
             for b, length, n in avoid if n and held_out.size > length]
    starts = heldout.tile_starts(held_out.size, seq_len, num_windows, spans)  # [W]
    rows, real = heldout.padded_rows(starts.size, batch_size)  # [batches, B] each
    return [real_rows(cut_windows(held_out, starts[index], seq_len), weight)
            for index, weight in zip(rows, real, strict=True)]


def real_rows(batch: Batch, real: np.ndarray) -> Batch:
    """`batch` with the weights of rows where `real` [B] is False set to 0 (padding)."""
    return Batch(batch.inputs, batch.targets, batch.weights * real[:, None])
