"""The `hf:` source on a small data set written here in the Hugging Face layout (parquet files
under data/, an optional README.md card), read offline: its batches against the byte stream
built here from the same texts, determinism, per-process shards, validation, exact resume."""

import zlib

import datasets  # the [hf] extra, part of the [test] extra
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import tiny_config

from scale_ablation.data import huggingface as hf_data
from scale_ablation.data import sources as data
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import hooks, train

SHARDS = 4


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    """No test here may reach the network, nor leave files in the user's cache."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(datasets.config, name, True)
    cache = tmp_path_factory.getbasetemp() / "hf_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)


def make_texts(count: int, seed: int) -> list[str]:
    """Rows of 5-120 characters, one with a two-byte character, none with a newline inside."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghij klmnopqrstuvwxyz,."))
    texts = ["".join(rng.choice(letters, size=rng.integers(5, 120))) for _ in range(count)]
    texts[3] += " café"
    return texts


def write_dataset(root, train_texts, val_texts=None, card_bytes=None):
    """`root` in the hub's layout: train split in SHARDS files, optional validation and card."""
    (root / "data").mkdir(parents=True)
    for i, part in enumerate(np.array_split(np.array(train_texts, dtype=object), SHARDS)):
        pq.write_table(pa.table({"text": list(part)}),
                       root / "data" / f"train-{i:05d}-of-{SHARDS:05d}.parquet")
    if val_texts is not None:
        pq.write_table(pa.table({"text": val_texts}),
                       root / "data" / "validation-00000-of-00001.parquet")
    if card_bytes is not None:
        (root / "README.md").write_text(
            "---\ndataset_info:\n  features:\n  - name: text\n    dtype: string\n  splits:\n"
            f"  - name: train\n    num_bytes: {card_bytes}\n"
            f"    num_examples: {len(train_texts)}\n---\n")
    return root


def byte_stream(texts) -> bytes:
    """One pass as documented: each text, newline-terminated (none of these ends with one)."""
    return "".join(text + "\n" for text in texts).encode("utf-8")


TRAIN = make_texts(120, seed=1)
VAL = make_texts(30, seed=2)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("hf") / "corpus", TRAIN, VAL)


def config_of(root, seq_len=32):
    return tiny_config(**{"data.source": f"hf:{root}", "data.seq_len": seq_len}).data


def windows_of(stream: bytes, first: int, count: int, width: int) -> np.ndarray:
    """Windows first..first+count-1 of `stream` repeated pass after pass: [count, width]."""
    repeated = np.frombuffer(stream * ((first + count) * width // len(stream) + 1), np.uint8)
    return repeated[first * width:(first + count) * width].reshape(count, width)


def test_windows_are_the_byte_stream_pass_after_pass(corpus_dir):
    source = data.make_source(config_of(corpus_dir), seed=0)
    stream = byte_stream(TRAIN)
    count = 2 * len(stream) // 33 + 5  # over two passes
    read = source.reader(0, 1, 33).read(count)
    np.testing.assert_array_equal(read, windows_of(stream, 0, count, 33))
    # The count baselines' sample: the first 8 MB of one pass, here the whole pass.
    assert bytes(source.train) == stream


def test_unshuffled_batches_are_consecutive_windows(corpus_dir):
    source = hf_data.HFStream(hf_data.open_corpus(str(corpus_dir)), seed=0, shuffle_windows=1)
    stream = byte_stream(TRAIN)
    for step in (0, 1, 7, 3):  # a step back reads again from the start
        batch = source.train_batch(step, 4, 32)
        expected = windows_of(stream, 4 * step, 4, 33).astype(np.int32)
        np.testing.assert_array_equal(batch.inputs, expected[:, :-1])
        np.testing.assert_array_equal(batch.targets, expected[:, 1:])
    reference = data.make_source(tiny_config().data, seed=0).train_batch(0, 4, 32)
    for name in ("inputs", "targets", "weights"):  # the shapes and dtypes of the other sources
        got, want = getattr(batch, name), getattr(reference, name)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert batch.weights.min() == 1


def test_shuffled_batches_are_deterministic_and_permute_each_block(corpus_dir):
    def source(seed):
        return hf_data.HFStream(hf_data.open_corpus(str(corpus_dir)), seed, shuffle_windows=16)

    def rows(src, steps):
        return np.concatenate([src.train_batch(s, 4, 32).inputs for s in steps])

    first, again, other_seed = rows(source(5), range(8)), rows(source(5), range(8)), rows(
        source(6), range(8))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other_seed)
    stream = windows_of(byte_stream(TRAIN), 0, 32, 33)[:, :-1].astype(np.int32)
    for block in range(2):  # steps 4b..4b+3 hold exactly windows 16b..16b+15
        got = first[16 * block:16 * (block + 1)]
        want = stream[16 * block:16 * (block + 1)]
        assert sorted(map(bytes, got.astype(np.uint8))) == sorted(map(bytes, want.astype(np.uint8)))
    # Resumed at step 6 (block 1): the same rows as read on from step 0.
    np.testing.assert_array_equal(rows(source(5), [6, 7]), first[24:32])


@pytest.mark.parametrize("process_count", [2, 3])
def test_each_process_reads_its_own_shard(corpus_dir, process_count):
    source = data.make_source(config_of(corpus_dir), seed=0)
    texts = [[row.decode().removesuffix("\n") for row in source.shard_pass(p, process_count)]
             for p in range(process_count)]
    assert sorted(t for part in texts for t in part) == sorted(TRAIN)  # disjoint and complete
    for part in texts:  # each in the files' order
        assert [TRAIN.index(t) for t in part] == sorted(TRAIN.index(t) for t in part)
    unshuffled = hf_data.HFStream(source.corpus, seed=0, shuffle_windows=1)
    for p, part in enumerate(texts):
        batch = unshuffled.train_batch(2, 6 * process_count, 32, process_index=p,
                                       process_count=process_count)
        expected = windows_of(byte_stream(part), 2 * 6, 6, 33).astype(np.int32)
        np.testing.assert_array_equal(batch.inputs, expected[:, :-1])


def test_validation_is_the_datasets_own_split(corpus_dir):
    val_stream = byte_stream(VAL)
    first = data.make_source(config_of(corpus_dir), seed=0).val_batches(8, 32, 2)
    other_seed = data.make_source(config_of(corpus_dir), seed=9).val_batches(8, 32, 2)
    for batch, again in zip(first, other_seed, strict=True):
        np.testing.assert_array_equal(batch.inputs, again.inputs)
        for row in range(8):
            window = bytes(batch.inputs[row].astype(np.uint8)) + bytes([batch.targets[row, -1]])
            assert window in val_stream


def test_without_a_validation_split_rows_are_held_out(tmp_path):
    texts = make_texts(400, seed=3)
    root = write_dataset(tmp_path / "corpus", texts)
    source = data.make_source(config_of(root, seq_len=16), seed=0)
    held = [t for t in texts if zlib.crc32(t.encode()) % hf_data.HELD_OUT_EVERY == 0]
    assert held, "the rule holds out some rows of 400"
    trained = [row.decode().removesuffix("\n") for row in source.shard_pass(0, 1)]
    assert sorted(trained) == sorted(set(texts) - set(held))
    assert source.train_bytes is None
    for row in source.val_batches(16, 16, 1)[0].inputs:
        assert bytes(row.astype(np.uint8)) in byte_stream(held)


def test_the_test_split_is_the_datasets_own_or_validation_outside_its_windows(tmp_path,
                                                                              corpus_dir):
    test_texts = make_texts(60, seed=5)
    root = write_dataset(tmp_path / "with_test", TRAIN, VAL)
    pq.write_table(pa.table({"text": test_texts}), root / "data" / "test-00000-of-00001.parquet")
    own = data.make_source(config_of(root, seq_len=16), seed=0)
    rows = own.test_batches(4, 16, 30, avoid=[(4, 16, 1)])
    windows = [bytes(np.append(b.inputs[r], b.targets[r, -1]).astype(np.uint8))
               for b in rows for r in range(4) if b.weights[r].any()]
    assert len(windows) == 30 and all(w in byte_stream(test_texts) for w in windows)
    # No test split: tiles of the validation bytes, none overlapping a validation window.
    source = data.make_source(config_of(corpus_dir, seq_len=16), seed=0)
    stream = byte_stream(VAL)
    read = np.zeros(len(stream), bool)
    for s in np.random.default_rng([data.VALIDATION_SEED, 0]).integers(0, len(stream) - 16, 4):
        read[s:s + 17] = True
    for batch in source.test_batches(4, 16, 40, avoid=[(4, 16, 1)]):
        for r in np.flatnonzero(batch.weights.any(axis=1)):
            window = bytes(np.append(batch.inputs[r], batch.targets[r, -1]).astype(np.uint8))
            k = [i for i in range(0, len(stream) - 16, 17) if stream[i:i + 17] == window]
            assert len(k) == 1 and not read[k[0]:k[0] + 17].any()


def test_bad_hf_sources_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"data\.source hf:.*missing") as error:
        data.make_source(config_of(tmp_path / "missing"), seed=0)
    assert "\n" not in str(error.value)
    (tmp_path / "no_text" / "data").mkdir(parents=True)
    pq.write_table(pa.table({"words": ["a b c"] * 50}),
                   tmp_path / "no_text" / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match=r"has no 'text' column \(it has words\)"):
        data.make_source(config_of(tmp_path / "no_text"), seed=0)


def test_a_named_configuration_is_read_with_its_own_size(tmp_path):
    """`hf:PATH:CONFIG` on the hub's multi-configuration layout (as Salesforce/wikitext has):
    one folder per configuration, the card listing each one's files and sizes."""
    root = tmp_path / "multi"
    card = ["---", "dataset_info:"]
    configs = ["configs:"]
    for name, count in (("big", 40), ("small", 10)):
        (root / name).mkdir(parents=True)
        for split in ("train", "validation"):
            texts = [f"{name} {split} {i}" for i in range(count)]
            pq.write_table(pa.table({"text": texts}),
                           root / name / f"{split}-00000-of-00001.parquet")
        card += [f"- config_name: {name}", "  features:", "  - name: text", "    dtype: string",
                 "  splits:", "  - name: train", f"    num_bytes: {100 * count}",
                 f"    num_examples: {count}"]
        configs += [f"- config_name: {name}", "  data_files:"]
        configs += [f"  - split: {split}\n    path: {name}/{split}-*"
                    for split in ("train", "validation")]
    (root / "README.md").write_text("\n".join([*card, *configs, "---", ""]))
    source = data.make_source(config_of(f"{root}:small", seq_len=8), seed=0)
    assert bytes(source.train) == byte_stream([f"small train {i}" for i in range(10)])
    assert bytes(source.validation_bytes) == byte_stream([f"small validation {i}"
                                                          for i in range(10)])
    assert source.train_bytes == 1000
    with pytest.raises(ValueError, match=r"hf:.*multi: .*Config name is missing.*big"):
        data.make_source(config_of(root, seq_len=8), seed=0)


def metric_rows(workdir):
    return [{k: v for k, v in row.items() if not k.startswith("perf/")}
            for row in RunFiles(workdir).read_metrics()]


def test_a_resumed_run_reads_the_batches_of_an_uninterrupted_one(corpus_dir, tmp_path,
                                                                  monkeypatch, capsys):
    # Blocks of 8 windows (two steps): the run preempted after step 7 (SIGTERM: it checkpoints
    # there) resumes in a later block, reading and skipping the blocks before it.
    monkeypatch.setattr(hf_data, "SHUFFLE_WINDOWS", 8)
    config = tiny_config(**{"data.source": f"hf:{corpus_dir}"})
    whole = train.train(config, tmp_path / "whole")
    assert whole["status"] == "completed"
    assert whole["passes_over_data"] is None  # no card: the size is unknown, not guessed
    assert "passes over" not in capsys.readouterr().out
    (stop,) = hooks.hooks_from_environment({hooks.SIGNAL_AT_ENV: "7:SIGTERM"})
    stopped = train.train(config, tmp_path / "resumed", extra_hooks=[stop])
    assert stopped["status"] != "completed"
    resumed = train.train(config, tmp_path / "resumed")
    assert resumed["status"] == "completed"
    assert metric_rows(tmp_path / "resumed") == metric_rows(tmp_path / "whole")


def test_a_known_size_gives_passes_and_the_repeated_data_warning(tmp_path, capsys):
    texts = make_texts(12, seed=4)  # under 1 kB: ten steps of 4 × 32 bytes read it over once
    size = len(byte_stream(texts))
    root = write_dataset(tmp_path / "corpus", texts, VAL, card_bytes=size)
    config = tiny_config(**{"data.source": f"hf:{root}"})
    summary = train.train(config, tmp_path / "run")
    tokens = 10 * 4 * 32
    assert summary["passes_over_data"] == pytest.approx(tokens / size)
    assert summary["passes_over_data"] > 1
    out = capsys.readouterr().out
    assert "warning:" in out and f"{tokens / size:.1f} passes" in out
