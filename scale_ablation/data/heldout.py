"""The test split's rules: which held-out windows report a run's result (pure NumPy).

Validation chooses (the best LR, the step to stop at); the test split reports, once, at the end
of a run (`training/evaluation.py`). A set that both chooses and reports is biased towards the
winner by its own sampling noise (the winner's curse; Cawley & Talbot 2010, "On over-fitting in
model selection"), so the two must share nothing.

Text sources. The training bytes of every published run, and the validation windows that chose
its LR, stay exactly as they were. Every Shakespeare play is already train or validation (34 and
4 plays), so holding out further plays would change the training bytes; instead the test windows
are cut from the held-out (validation) plays, or a corpus's held-out slice or files, and share no
byte with any validation window of the run:

  1. tile the held-out bytes into consecutive windows of seq_len + 1 bytes (inputs are a window's
     first seq_len bytes, targets its last seq_len: tiles share no byte, so no target is scored
     twice);
  2. order the tiles by one fixed permutation (`heldout_rng(0)`; independent of the train seed), so
     that the test set spreads over the whole held-out text;
  3. drop every tile that overlaps a validation window the run reads (at `data.seq_len` and each
     `train.eval_seq_lens`);
  4. take the first ceil(data.test_bytes / seq_len) tiles: at least `data.test_bytes` targets.

At the CPU studies' settings (seq_len 128, batch 16, 4 validation batches) the validation windows
read 8.3 KB of the 513 KB of validation plays; the test set takes 2,048 tiles, 264 KB, of the rest.
A source whose held-out bytes hold fewer tiles gives what it has (the caller says so).

MQAR. Fresh sequences from their own generators: batch i of the test set is drawn by
`heldout_rng(i)`, seeded [TEST_SEED, i] with spawn key (TEST_STREAM,), which NumPy assembles into five
32-bit words [TEST_SEED, i, 0, 0, TEST_STREAM]. A training generator is seeded [seed, step] and a
validation one [VALIDATION_SEED, i]: NumPy writes an integer as its 32-bit words, the top one
non-zero (0 is the single word [0]), so those give five words only for a seed >= 2**96 (four words
of seed, the top one non-zero, where the test has 0) or a step >= 2**64. No training or
validation generator is seeded as a test one, whatever the train seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

TEST_SEED = 0x7E57_5EED
TEST_STREAM = 1  # the spawn key that keeps test generators apart from [seed, step] ones


def heldout_rng(index: int) -> np.random.Generator:
    """The generator of the test set's `index`-th draw (see the module docstring)."""
    return np.random.default_rng(np.random.SeedSequence([TEST_SEED, index],
                                                        spawn_key=(TEST_STREAM,)))


def window_count(test_bytes: int, seq_len: int) -> int:
    """Windows of `seq_len` targets that score at least `test_bytes` targets (0: no test)."""
    if not isinstance(test_bytes, int) or test_bytes < 0:
        raise ValueError(f"data.test_bytes must be an integer >= 0 (0: no test split), "
                         f"got {test_bytes!r}")
    return math.ceil(test_bytes / seq_len)


def tile_starts(size: int, seq_len: int, num_windows: int,
                avoid: Sequence[tuple[np.ndarray, int]] = ()) -> np.ndarray:
    """[<= num_windows] starts of the test tiles of a held-out text of `size` bytes: rules 1-4
    of the module docstring. `avoid`: (starts, seq_len) of each validation set, whose windows
    cover bytes [start, start + seq_len]."""
    width = seq_len + 1
    num_tiles = size // width
    blocked = np.zeros(num_tiles, bool)
    for starts, length in avoid:
        first = np.asarray(starts) // width  # the tile holding a window's first byte
        last = np.minimum((np.asarray(starts) + length) // width, num_tiles - 1)  # and its last
        # Mark the tiles [first, last] of each window: +1 at first, -1 after last, cumulative sum.
        marks = np.zeros(num_tiles + 1, np.int64)
        np.add.at(marks, first[first < num_tiles], 1)
        np.add.at(marks, last[first < num_tiles] + 1, -1)
        blocked |= np.cumsum(marks[:-1]) > 0
    order = heldout_rng(0).permutation(num_tiles)
    return order[~blocked[order]][:num_windows] * width


def padded_rows(count: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """([batches, B] row indices into `count` windows, [batches, B] 1 where a row is real): the
    last batch is filled with copies of window 0 that weigh nothing, so that every test batch
    has the validation batches' shape and runs in their compiled program."""
    batches = math.ceil(count / batch_size)
    index = np.arange(batches * batch_size).reshape(batches, batch_size)
    real = index < count
    return np.where(real, index, 0), real
