"""A Hugging Face dataset streamed as bytes: `data.source = "hf:PATH_OR_NAME[:CONFIG]"`.

PATH_OR_NAME is a hub dataset ("Salesforce/wikitext") or a local directory in the hub's layout
(parquet files such as data/train-00000-of-00002.parquet, optionally a README.md card);
CONFIG is the dataset's configuration ("wikitext-103-raw-v1"). Nothing is downloaded up front:
the corpus is read with `datasets.load_dataset(..., streaming=True)` as training goes.

The byte stream: each row's `text` column as UTF-8, followed by a newline unless it ends with one
(so line-per-row corpora such as WikiText read back as their files, and documents stay apart).
A pass that ends starts again from the first row.

Training batches. Each JAX process reads its own shard of the training split
(`datasets.distributed.split_dataset_by_node`: whole files when their number divides by the
process count, else every P-th row), cut into consecutive windows of seq_len + 1 bytes. The
windows are taken in blocks of `shuffle_windows`, each block permuted by
rng(seed, process, block); step s's rows are windows [s·R, (s+1)·R) of that order, R = the
process's rows. So a batch is a function of (seed, step, process index, process count): the
same bytes for every seed, in a seed-dependent order within a block. Unlike the in-memory
sources, the global batch depends on the process count (each process streams its own part).

Resume reads the stream again from its start and skips the windows of the steps already taken:
exact by construction (nothing but the step is needed, so checkpoints stay as they are) at the
cost of one sequential read of what was consumed, paid only by a resumed run.

Validation: the dataset's `validation` split if it has one; else the held-out training rows,
those whose text's CRC-32 is divisible by HELD_OUT_EVERY (a rule independent of order, shard
and process count; training skips them). At most VALIDATION_BYTES of it are read, and the
windows are drawn from them as for the in-memory corpora (independent of the seed).

Test (`heldout.py`): the dataset's `test` split if it has one (its first VALIDATION_BYTES, tiled;
WikiText's 1.3 MB test split, say); else the validation bytes outside every validation window
the run reads, as for the in-memory corpora. Training reads neither.

Size: `train_bytes` is the training split's size from the dataset card (`num_bytes`) when the
card gives it, the split has only a text column and nothing is held out; None (unknown) otherwise.
Passes computed from it are close, not exact: the card counts the split as `datasets` stores it
(Arrow: the text plus per-row offsets), and rows without a final newline gain one here.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from scale_ablation.data.windows import (
    Batch,
    ValidationSet,
    cut_windows,
    held_out_batches,
    process_rows,
    val_starts,
)

TEXT = "text"
SHUFFLE_WINDOWS = 8192  # windows permuted together: 4 MB of text at seq_len 512
VALIDATION_BYTES = 2 << 20  # the validation set is drawn from at most this much text
# No validation split: rows with crc32(text) % 20 == 0 are held out (5%, so the 2 MB of
# validation text are found in the first ~40 MB of the training split).
HELD_OUT_EVERY = 20
BASELINE_BYTES = 8 << 20  # the count baselines are fit on the first 8 MB of the training stream
READ_ROWS = 1024  # rows decoded per read from the stream


def _datasets(spec: str) -> Any:
    """The `datasets` package, imported on first use: the rest of the package works without it."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"data.source {spec} needs the [hf] extra: pip install -e '.[hf]'"
        ) from None
    return datasets


def row_bytes(text: str | None) -> bytes:
    """One row of the byte stream: its text, newline-terminated."""
    data = (text or "").encode("utf-8")
    return data if data.endswith(b"\n") else data + b"\n"


def held_out(text: str | None) -> bool:
    return zlib.crc32((text or "").encode("utf-8")) % HELD_OUT_EVERY == 0


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The opened dataset: its training split, where validation comes from, its known size."""

    spec: str
    train: Any  # datasets.IterableDataset
    validation: Any | None  # the `validation` split, or None: held-out training rows
    train_bytes: int | None
    test: Any | None = None  # the `test` split, or None: test windows come from validation


def open_corpus(arg: str) -> Corpus:
    """`hf:` + `arg` opened for streaming; ValueError (one line) if it cannot be."""
    spec = f"hf:{arg}"
    datasets = _datasets(spec)
    path, _, config = arg.partition(":")
    try:
        splits = datasets.load_dataset(path, config or None, streaming=True)
    except Exception as error:  # the library raises many kinds; all mean "cannot open this"
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = " ".join(lines[:2])  # what went wrong and, often, what to pick instead
        raise ValueError(f"data.source {spec}: {type(error).__name__}: {reason}") from None
    if "train" not in splits:
        raise ValueError(f"data.source {spec} has no train split (it has {', '.join(splits)})")
    train, validation, test = splits["train"], splits.get("validation"), splits.get("test")
    features = train.features  # None when only reading the data would tell
    if features is not None and TEXT not in features:
        raise ValueError(f"data.source {spec}: the train split has no {TEXT!r} column "
                         f"(it has {', '.join(features) or 'none'})")
    if features is not None:  # decode the text column alone
        train = train.select_columns([TEXT])
        validation, test = (split if split is None else split.select_columns([TEXT])
                            for split in (validation, test))
    split_info = (train.info.splits or {}).get("train")
    known = (validation is not None and features is not None and set(features) == {TEXT}
             and split_info is not None and split_info.num_bytes)
    return Corpus(spec, train, validation, int(split_info.num_bytes) if known else None, test)


def _rows(dataset: Any, keep: Callable[[str | None], bool] | None = None) -> Iterator[bytes]:
    """The byte rows of one pass over `dataset`, those `keep` accepts."""
    for chunk in dataset.iter(batch_size=READ_ROWS):
        for text in chunk[TEXT]:
            if keep is None or keep(text):
                yield row_bytes(text)


class WindowReader:
    """One process's training stream as consecutive windows of `width` bytes, read in order; a
    pass that ends starts the next from the shard's first row."""

    def __init__(self, open_pass: Callable[[], Iterator[bytes]], width: int, what: str):
        self._open_pass, self.width, self._what = open_pass, width, what
        self._rows = open_pass()
        self._pending = bytearray()
        self._pass_bytes = 0
        self.windows_read = 0

    def _more(self) -> None:
        row = next(self._rows, None)
        if row is not None:
            self._pending += row
            self._pass_bytes += len(row)
            return
        if self._pass_bytes == 0:
            raise ValueError(f"{self._what} is empty")
        self._rows, self._pass_bytes = self._open_pass(), 0  # the next pass

    def read(self, count: int) -> np.ndarray:
        """The next `count` windows, [count, width] uint8."""
        need = count * self.width
        while len(self._pending) < need:
            self._more()
        windows = np.frombuffer(bytes(self._pending[:need]), np.uint8).reshape(count, self.width)
        del self._pending[:need]
        self.windows_read += count
        return windows


class HFStream:
    """The `hf:` data source (see the module docstring): streamed training windows, a fixed
    validation set."""

    def __init__(self, corpus: Corpus, seed: int, shuffle_windows: int = SHUFFLE_WINDOWS):
        if seed < 0 or shuffle_windows < 1:
            raise ValueError(f"seed must be >= 0 and shuffle_windows >= 1, got {seed}, "
                             f"{shuffle_windows}")
        self.name, self.corpus, self.seed = corpus.spec, corpus, seed
        self.shuffle_windows = shuffle_windows
        self.train_bytes = corpus.train_bytes
        # (process_index, process_count, width) -> [reader, {block index: permuted windows}]
        self._readers: dict[tuple[int, int, int], list] = {}

    def shard_pass(self, process_index: int, process_count: int) -> Iterator[bytes]:
        """The byte rows of one pass over this process's shard of the training split."""
        shard = self.corpus.train
        if process_count > 1:
            _datasets(self.name)
            from datasets.distributed import split_dataset_by_node

            shard = split_dataset_by_node(shard, rank=process_index, world_size=process_count)
        keep = None if self.corpus.validation is not None else (lambda t: not held_out(t))
        return _rows(shard, keep)

    def reader(self, process_index: int, process_count: int, width: int) -> WindowReader:
        """A fresh reader of this process's windows from the start (tests read it directly)."""
        what = f"data.source {self.name} training shard {process_index} of {process_count}"
        return WindowReader(functools.partial(self.shard_pass, process_index, process_count),
                            width, what)

    def _block(self, key: tuple[int, int, int], block: int) -> np.ndarray:
        """Block `block` of this process's windows, permuted: [shuffle_windows, width]."""
        state = self._readers.get(key)
        if state is not None and block in state[1]:
            return state[1][block]
        if state is None or state[0].windows_read > block * self.shuffle_windows:
            state = self._readers[key] = [self.reader(*key), {}]  # a resume, or a step back
        reader, blocks = state
        start = block * self.shuffle_windows
        while reader.windows_read < start:  # skip the windows of the steps already taken
            reader.read(min(self.shuffle_windows, start - reader.windows_read))
        order = np.random.default_rng([self.seed, key[0], block]).permutation(
            self.shuffle_windows)
        blocks.clear()  # steps move forward: only the block being read is kept
        blocks[block] = reader.read(self.shuffle_windows)[order]
        return blocks[block]

    def train_batch(self, step: int, batch_size: int, seq_len: int, *,
                    process_index: int = 0, process_count: int = 1) -> Batch:
        rows = process_rows(batch_size, process_index, process_count)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        count = rows.stop - rows.start
        key = (process_index, process_count, seq_len + 1)
        index = step * count + np.arange(count)  # this process's window numbers for `step`
        parts = []
        for block in np.unique(index // self.shuffle_windows):
            mine = index[index // self.shuffle_windows == block] % self.shuffle_windows
            parts.append(self._block(key, int(block))[mine])
        return _rows_to_batch(np.concatenate(parts), seq_len)

    @functools.cached_property
    def train(self) -> np.ndarray:
        """The first BASELINE_BYTES of one pass over the training stream, [N] uint8: what the
        unigram and bigram baselines are counted on, since the split is not held in memory.
        Not the split's size: that is `train_bytes`."""
        return _prefix(self.shard_pass(0, 1), BASELINE_BYTES)

    @functools.cached_property
    def validation_bytes(self) -> np.ndarray:
        """The first VALIDATION_BYTES of the validation stream, [N] uint8."""
        if self.corpus.validation is not None:
            return _prefix(_rows(self.corpus.validation), VALIDATION_BYTES)
        return _prefix(_rows(self.corpus.train, held_out), VALIDATION_BYTES)

    def val_batches(self, batch_size: int, seq_len: int, num_batches: int) -> list[Batch]:
        val = self.validation_bytes
        if val.size < seq_len + 1:
            raise ValueError(f"data.source {self.name} validation split has {val.size} bytes, "
                             f"fewer than seq_len + 1 = {seq_len + 1}")
        return [cut_windows(val, val_starts(val.size, batch_size, seq_len, i), seq_len)
                for i in range(num_batches)]

    def test_batches(self, batch_size: int, seq_len: int, num_windows: int, *,
                     avoid: Sequence[ValidationSet] = ()) -> list[Batch]:
        if self.corpus.test is None:  # validation's bytes, outside its windows
            return held_out_batches(self.validation_bytes, batch_size, seq_len, num_windows,
                                    avoid)
        test = _prefix(_rows(self.corpus.test), VALIDATION_BYTES)  # a split of its own
        return held_out_batches(test, batch_size, seq_len, num_windows)


def _prefix(rows: Iterator[bytes], limit: int) -> np.ndarray:
    """The first `limit` bytes of `rows` (all of them if fewer), read-only [N] uint8."""
    chunks, size = [], 0
    for row in rows:
        chunks.append(row)
        size += len(row)
        if size >= limit:
            break
    prefix = np.frombuffer(b"".join(chunks)[:limit], np.uint8)
    prefix.flags.writeable = False
    return prefix


def _rows_to_batch(windows: np.ndarray, seq_len: int) -> Batch:
    windows = windows.astype(np.int32)  # [R, T+1]
    return Batch(inputs=windows[:, :-1], targets=windows[:, 1:],
                 weights=np.ones((windows.shape[0], seq_len), np.float32))


def make_hf_source(arg: str, seed: int, seq_len: int) -> HFStream:
    """The `hf:arg` source, its validation set read and checked against `seq_len`."""
    source = HFStream(open_corpus(arg), seed, SHUFFLE_WINDOWS)
    source.val_batches(1, seq_len, 1)  # reads the validation bytes: too few is refused now
    return source
