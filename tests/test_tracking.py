"""Run files and the W&B writer: round trips, crash tolerance, secrets, offline W&B runs.

W&B runs here are offline only; the history is read back from wandb's own transaction log and
compared with what was passed to `log`.
"""

import json
import math
import os
import socket
import struct
import zlib
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from scale_ablation.records import (
    jsonfiles,
    redaction,
    run_files,
    tracking,
    wandb_offline,
    wandb_tracker,
)
from scale_ablation.records.run_files import RunFiles
from scale_ablation.records.wandb_tracker import WandbSettings, WandbTracker

FAKE_API_KEY = "f4ke0a1b2c3d4e5f60718293a4b5c6d7e8f90123"  # 40 hex chars, like a real key


@pytest.fixture(autouse=True)
def isolated_wandb_env(tmp_path_factory, monkeypatch):
    """No real credentials, config or network settings leak in; wandb stays quiet."""
    for name in list(os.environ):
        if name.startswith("WANDB_") or name == "NETRC":
            monkeypatch.delenv(name)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / ".cache" / "wandb"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / ".local" / "wandb"))


def _strict_json(line: str):
    def reject(token):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=reject)


def open_run(workdir, config, wandb_config, **kwargs):
    """A run's trackers as the training loop opens them."""
    return tracking.open_trackers(workdir, config, wandb=WandbSettings.of(wandb_config), **kwargs)


# --- run files --------------------------------------------------------------------------------


def test_metrics_round_trip_numpy_jax_and_nonfinite(tmp_path):
    import jax.numpy as jnp

    files = RunFiles(tmp_path / "run")
    files.append_metrics(
        0,
        {
            "train/loss": np.float32(2.5),
            "tokens": np.int64(4096),
            "val/loss": jnp.asarray(1.25, dtype=jnp.float32),
            "attn/layer0/entropy": jnp.float32(0.75),
            "healthy": np.bool_(True),
        },
    )
    files.append_metrics(1, {"train/loss": float("nan"), "grad_norm": np.float64(np.inf)})
    files.append_metrics(2, {"train/loss": -np.inf, "note": "ok"})

    assert files.read_metrics() == [
        {
            "step": 0,
            "train/loss": 2.5,
            "tokens": 4096,
            "val/loss": 1.25,
            "attn/layer0/entropy": 0.75,
            "healthy": True,
        },
        {"step": 1, "train/loss": None, "grad_norm": None},
        {"step": 2, "train/loss": None, "note": "ok"},
    ]
    # Every line is standard JSON: no NaN/Infinity tokens that other readers reject.
    for line in files.metrics_path.read_text().splitlines():
        _strict_json(line)
    assert isinstance(files.read_metrics()[0]["tokens"], int)


def test_truncated_last_line_is_skipped_and_not_glued_to_the_next(tmp_path):
    files = RunFiles(tmp_path)
    for step in range(3):
        files.append_metrics(step, {"train/loss": float(step)})
    with open(files.metrics_path, "a") as f:
        f.write('{"step": 3, "train/lo')  # a process killed mid-write

    assert [row["step"] for row in files.read_metrics()] == [0, 1, 2]

    resumed = RunFiles(tmp_path)
    resumed.append_metrics(3, {"train/loss": 3.0})
    assert [row["step"] for row in resumed.read_metrics()] == [0, 1, 2, 3]
    assert all(_strict_json(line) for line in files.metrics_path.read_text().splitlines())


def test_damaged_middle_line_is_an_error(tmp_path):
    files = RunFiles(tmp_path)
    files.metrics_path.write_text('{"step": 0}\n{"step": 1, oops\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        files.read_metrics()


def test_truncate_metrics_after_drops_later_steps_for_a_resume(tmp_path):
    files = RunFiles(tmp_path)
    for step in range(0, 100, 10):
        files.append_metrics(step, {"train/loss": 1.0 / (step + 1)})

    files.truncate_metrics_after(40)
    assert [row["step"] for row in files.read_metrics()] == [0, 10, 20, 30, 40]

    for step in (50, 60):  # the resumed run logs these again
        files.append_metrics(step, {"train/loss": 0.0})
    steps = [row["step"] for row in files.read_metrics()]
    assert steps == [0, 10, 20, 30, 40, 50, 60]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temp files

    RunFiles(tmp_path / "fresh").truncate_metrics_after(5)  # nothing to truncate
    assert not (tmp_path / "fresh").exists()


def test_summary_is_replaced_atomically(tmp_path, monkeypatch):
    files = RunFiles(tmp_path)
    files.write_summary({"status": "preempted", "final_train_loss": float("nan")})
    assert files.read_summary() == {"status": "preempted", "final_train_loss": None}
    _strict_json(files.summary_path.read_text())

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(jsonfiles.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        files.write_summary({"status": "completed", "final_train_loss": 1.0})
    assert files.read_summary() == {"status": "preempted", "final_train_loss": None}


def test_config_round_trip_from_config_dict(tmp_path):
    config = ml_collections.ConfigDict({"model": {"head_dim": 64}, "wandb": {"tags": ("a", "b")}})
    files = RunFiles(tmp_path)
    assert files.read_config() is None
    files.write_config(config)
    assert files.read_config() == {"model": {"head_dim": 64}, "wandb": {"tags": ["a", "b"]}}
    assert files.config_path.read_text().startswith('{\n  "model"')  # indent 2, sorted keys


# --- secrets ----------------------------------------------------------------------------------


def test_scrub_secrets_drops_credential_keys_and_redacts_env_values(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    monkeypatch.setenv("MY_TOKEN", "short")  # under 8 characters: too common to redact
    config = {
        "wandb": {"api_key": FAKE_API_KEY, "project": "scale_ablation", "apiKey": "x"},
        "hf_token": "hf_abcdefghijklmnop",
        "accessToken": "x",
        "db_password": "x",
        "client_secret": "x",
        "credentials_path": "x",
        "notes": f"launched with key {FAKE_API_KEY} by mistake",
        "urls": ["https://hf.co?t=hf_abcdefghijklmnop", "https://example.com"],
        "tokens_per_second": 123.0,
        "tokenizer": "bytes",
        "max_tokens": 10,
        "flag": "short",
    }
    original = json.dumps(config, sort_keys=True)

    scrubbed = redaction.scrub_secrets(config)

    assert scrubbed == {
        "wandb": {"project": "scale_ablation"},
        "notes": "<redacted>",
        "urls": ["<redacted>", "https://example.com"],
        "tokens_per_second": 123.0,
        "tokenizer": "bytes",
        "max_tokens": 10,
        "flag": "short",
    }
    assert json.dumps(config, sort_keys=True) == original  # the input is untouched
    assert FAKE_API_KEY not in json.dumps(scrubbed)


# --- resolve_wandb_mode -----------------------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("resolve_wandb_mode touched the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_resolve_auto_is_offline_without_credentials(no_network):
    assert wandb_tracker.resolve_wandb_mode("auto") == "offline"


def test_resolve_auto_is_online_with_a_netrc_entry(tmp_path, monkeypatch, no_network):
    netrc = Path(os.environ["HOME"]) / ".netrc"
    netrc.write_text("machine example.com login me password other\n")
    netrc.chmod(0o600)
    assert wandb_tracker.resolve_wandb_mode("auto") == "offline"  # not a W&B entry

    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE_API_KEY}\n")
    assert wandb_tracker.resolve_wandb_mode("auto") == "online"

    # $NETRC wins over ~/.netrc, as in wandb.
    elsewhere = tmp_path / "empty_netrc"
    elsewhere.write_text("")
    monkeypatch.setenv("NETRC", str(elsewhere))
    assert wandb_tracker.resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_tracker.resolve_wandb_mode("auto") == "online"

    # A self-hosted server needs its own entry.
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.mylab.org")
    assert wandb_tracker.resolve_wandb_mode("auto") == "offline"


def test_resolve_auto_follows_env(monkeypatch, no_network):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_API_KEY)
    assert wandb_tracker.resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_tracker.resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_tracker.resolve_wandb_mode("auto") == "disabled"
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_tracker.resolve_wandb_mode("auto") == "online"


def test_resolve_explicit_and_invalid_modes(monkeypatch, no_network):
    monkeypatch.setenv("WANDB_MODE", "disabled")  # only `auto` defers to the environment
    for mode in ("online", "offline", "disabled"):
        assert wandb_tracker.resolve_wandb_mode(mode) == mode
    with pytest.raises(ValueError, match=r"wandb\.mode.*auto, online, offline, disabled"):
        wandb_tracker.resolve_wandb_mode("dryrun")


def test_tracker_rejects_an_invalid_mode_before_writing(tmp_path):
    with pytest.raises(ValueError, match=r"wandb\.mode"):
        open_run(tmp_path / "run", {"a": 1}, {"mode": "Offline"})
    assert not (tmp_path / "run").exists()


# --- offline W&B runs -------------------------------------------------------------------------


def _offline(**fields):
    return {"mode": "offline", "project": "scale_ablation_tests", **fields}


def test_offline_run_history_matches_what_was_logged_and_the_jsonl(tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(wandb_tracker.logging, "warning", lambda *args: warnings.append(args))
    workdir = tmp_path / "run"
    rng = np.random.default_rng(0)
    losses = rng.uniform(1.0, 5.0, size=300).astype(np.float32)
    tracker = open_run(workdir, {"policy": "inv_sqrt_dk"}, _offline(tags=("test",)))
    assert tracker.wandb.active

    logged = []
    for step, loss in enumerate(losses):
        metrics = {"train/loss": loss, "attn/layer0/entropy": 0.5 + step / 1000}
        if step == 7:
            metrics["train/loss"] = float("nan")
        if step % 50 == 0:
            metrics["val/loss"] = float(loss) + 0.25
        tracker.log(step, metrics)
        logged.append({k: float(v) for k, v in metrics.items()})
    tracker.summary(dict(status="completed", steps_completed=300, final_train_loss=1.5))
    tracker.finish()

    run_dir = tracker.wandb.run_dir
    assert run_dir.parent == workdir / "wandb"
    (wandb_file,) = run_dir.glob("run-*.wandb")
    assert wandb_file.stat().st_size > 2 * 32768  # records cross LevelDB block boundaries

    history = wandb_offline.read_history(run_dir)
    jsonl = tracker.files.read_metrics()
    assert [row["_step"] for row in history] == list(range(300))
    assert [row["step"] for row in jsonl] == list(range(300))
    for sent, from_wandb, from_jsonl in zip(logged, history, jsonl, strict=True):
        for key, value in sent.items():
            if math.isnan(value):
                assert math.isnan(from_wandb[key]) and from_jsonl[key] is None
            else:
                assert from_wandb[key] == value == from_jsonl[key], key
        assert ("val/loss" in from_wandb) == ("val/loss" in sent) == ("val/loss" in from_jsonl)

    summary = tracker.files.read_summary()
    assert summary["wandb_run_id"] == tracker.wandb.run_id
    assert summary["status"] == "completed" and summary["final_val_loss"] is None
    wandb_summary = wandb_offline.read_summary(run_dir)
    assert wandb_summary["status"] == "completed"
    assert wandb_summary["steps_completed"] == 300
    assert wandb_summary["final_train_loss"] == 1.5
    assert wandb_summary["train/loss"] == float(losses[-1])  # wandb's own last-value summary
    # Validation metrics are summarised by their best value (metric definitions), not the last.
    val_losses = [row["val/loss"] for row in logged if "val/loss" in row]
    assert val_losses[-1] != min(val_losses)  # the check below can tell min from last
    assert wandb_summary["val/loss"] == {"min": pytest.approx(min(val_losses))}
    assert warnings == []


def test_log_table_stores_the_rows(tmp_path):
    writer = WandbTracker(tmp_path, {}, WandbSettings(mode="offline", project="scale_ablation_tests"))
    columns = ["policy", "head_dim", "final_loss"]
    rows = [["inv_sqrt_dk", 64, 1.5], ["none", np.int64(256), np.float32(4.25)]]
    writer.log(0, {"train/loss": 2.0})
    writer.log_table("sweep/summary", columns, rows)
    writer.finish()

    (reference,) = [
        row["sweep/summary"]
        for row in wandb_offline.read_history(writer.run_dir)
        if "sweep/summary" in row
    ]
    assert reference["_type"] == "table-file"
    table = json.loads((writer.run_dir / "files" / reference["path"]).read_text())
    assert table["columns"] == columns
    assert table["data"] == [["inv_sqrt_dk", 64, 1.5], ["none", 256, 4.25]]


def test_wandb_history_reader_stops_at_a_truncated_record(tmp_path):
    writer = WandbTracker(tmp_path, {}, WandbSettings(mode="offline", project="scale_ablation_tests"))
    for step in range(200):
        writer.log(step, {"train/loss": float(step)})
    writer.finish()
    (wandb_file,) = writer.run_dir.glob("run-*.wandb")
    complete = wandb_offline.read_history(wandb_file)

    killed = tmp_path / "run-killed.wandb"
    killed.write_bytes(wandb_file.read_bytes()[: wandb_file.stat().st_size // 2])
    partial = wandb_offline.read_history(killed)

    assert 0 < len(partial) < len(complete) == 200
    assert partial == complete[: len(partial)]


def _leveldb_log(payloads: list[bytes]) -> bytes:
    """A .wandb file written straight from the LevelDB log spec (doc/log_format.md)."""
    block, out = 32768, bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for payload in payloads:
        first = True
        while True:
            room = block - len(out) % block
            if room < 7:  # too small for a chunk header: zero trailer
                out += bytes(room)
                continue
            fragment, payload = payload[: room - 7], payload[room - 7 :]
            last = not payload
            kind = (1 if last else 2) if first else (4 if last else 3)
            checksum = zlib.crc32(bytes([kind]) + fragment)
            out += struct.pack("<IHB", checksum, len(fragment), kind) + fragment
            first = False
            if last:
                break
    return bytes(out)


def _history_record(step: int, loss: float, *, size: int | None = None) -> bytes:
    """A serialized history Record, padded with a text field to exactly `size` bytes."""
    from wandb.proto import wandb_internal_pb2

    def serialize(filler: int) -> bytes:
        record = wandb_internal_pb2.Record()
        for key, value in (("_step", step), ("train/loss", loss), ("note", "x" * filler)):
            item = record.history.item.add()
            item.key, item.value_json = key, json.dumps(value)
        return record.SerializeToString()

    if size is None:
        return serialize(0)
    guess = size - len(serialize(0))  # one byte per character, give or take varint lengths
    for filler in range(max(0, guess - 8), guess + 8):
        if len(raw := serialize(filler)) == size:
            return raw
    raise AssertionError(f"no record of {size} bytes")


def test_wandb_history_reader_handles_block_trailers_and_fragments(tmp_path):
    # File header (7) + chunk header (7) + 32751 leaves 3 bytes in the first block: a trailer.
    # The third record (70 kB) spans three blocks as FIRST, MIDDLE and LAST chunks.
    payloads = [
        _history_record(0, 0.5, size=32768 - 7 - 7 - 3),
        _history_record(1, 0.25),
        _history_record(2, 0.125, size=70_000),
        _history_record(3, 0.0625),
    ]
    path = tmp_path / "run-synthetic.wandb"
    path.write_bytes(_leveldb_log(payloads))

    rows = wandb_offline.read_history(path)
    assert [(row["_step"], row["train/loss"]) for row in rows] == [
        (0, 0.5),
        (1, 0.25),
        (2, 0.125),
        (3, 0.0625),
    ]


def test_run_id_persists_and_a_second_writer_continues_the_run(tmp_path):
    first = WandbTracker(tmp_path, {"a": 1}, WandbSettings(mode="offline", project="scale_ablation_tests"))
    first.log(0, {"train/loss": 3.0})
    first.finish()
    assert (tmp_path / "wandb_run_id.txt").read_text().strip() == first.run_id

    second = WandbTracker(tmp_path, {"a": 1}, WandbSettings(mode="offline", project="scale_ablation_tests"))
    second.log(1, {"train/loss": 2.0})
    second.finish()

    assert second.run_id == first.run_id
    assert second.run_dir != first.run_dir
    run_dirs = wandb_offline.find_run_dirs(tmp_path, first.run_id)
    assert run_dirs == [first.run_dir, second.run_dir]
    assert [row["train/loss"] for d in run_dirs for row in wandb_offline.read_history(d)] == [
        3.0,
        2.0,
    ]


def test_resumed_tracker_rewinds_the_jsonl_and_keeps_the_run_id(tmp_path):
    first = open_run(tmp_path, {"a": 1}, _offline())
    for step in range(6):
        first.log(step, {"train/loss": float(step)})
    first.finish(exit_code=1)  # preempted after step 5, checkpoint at step 3

    second = open_run(tmp_path, {"a": 1}, _offline(), resume_step=3)
    for step in range(4, 8):
        second.log(step, {"train/loss": float(step)})
    second.finish()

    assert second.wandb.run_id == first.wandb.run_id
    assert [row["step"] for row in second.files.read_metrics()] == list(range(8))


def test_failing_wandb_init_degrades_to_a_no_op(tmp_path, monkeypatch):
    import wandb

    def broken_init(*args, **kwargs):
        raise RuntimeError("wandb-core did not start")

    warnings = []
    monkeypatch.setattr(wandb, "init", broken_init)
    monkeypatch.setattr(wandb_tracker.logging, "warning", lambda *args: warnings.append(args))

    tracker = open_run(tmp_path, {"a": 1}, _offline())
    tracker.log(0, {"train/loss": 1.0})
    tracker.wandb.log_table("sweep", ["a"], [[1]])
    tracker.summary(dict(status="completed"))
    tracker.finish()

    assert tracker.wandb.run_id is None and not tracker.wandb.active
    assert len(warnings) == 1 and "init" in warnings[0]
    assert tracker.files.read_metrics() == [{"step": 0, "train/loss": 1.0}]
    assert tracker.files.read_summary()["wandb_run_id"] is None
    assert not (tmp_path / "wandb_run_id.txt").exists()


def test_failing_wandb_log_warns_once_and_training_goes_on(tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(wandb_tracker.logging, "warning", lambda *args: warnings.append(args))
    tracker = open_run(tmp_path, {}, _offline())
    run = tracker.wandb._run

    def broken_log(*args, **kwargs):
        raise ConnectionError("stream closed")

    monkeypatch.setattr(run, "log", broken_log)
    for step in range(3):
        tracker.log(step, {"train/loss": 1.0})
    tracker.finish()

    assert len(warnings) == 1 and "log" in warnings[0]
    assert not tracker.wandb.active
    assert [row["step"] for row in tracker.files.read_metrics()] == [0, 1, 2]


def test_planted_secret_reaches_no_run_file(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_API_KEY)
    config = {
        "marker": "visible-config-value-42",
        "notes": f"key {FAKE_API_KEY}",
        "wandb": {"api_key": FAKE_API_KEY},
    }
    tracker = open_run(tmp_path, config, _offline())
    tracker.log(0, {"train/loss": 1.0})
    tracker.summary(dict(status="completed"))
    tracker.finish()

    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.suffix == ".wandb" for path in files)
    leaking = [path for path in files if FAKE_API_KEY.encode() in path.read_bytes()]
    assert leaking == []
    # The config did reach W&B, so the search above looked at a run that holds it.
    (wandb_file,) = tracker.wandb.run_dir.glob("*.wandb")
    assert b"visible-config-value-42" in wandb_file.read_bytes()


def test_disabled_tracker_writes_nothing(tmp_path):
    workdir = tmp_path / "host1"
    tracker = open_run(workdir, {"a": 1}, _offline(), resume_step=3, enable=False)
    tracker.log(0, {"train/loss": 1.0})
    tracker.summary(dict(status="completed"))
    tracker.finish()
    assert not workdir.exists()


def test_wandb_mode_disabled_still_writes_run_files(tmp_path):
    tracker = open_run(tmp_path, {"a": 1}, {"mode": "disabled", "project": "p"})
    tracker.log(0, {"train/loss": 1.0})
    tracker.summary(dict(status="diverged", diverged_at_step=0, final_train_loss=float("inf")))
    tracker.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "metrics.jsonl",
        "summary.json",
    ]
    summary = tracker.files.read_summary()
    assert set(run_files.SUMMARY_FIELDS) <= set(summary)
    assert summary["status"] == "diverged" and summary["final_train_loss"] is None


def test_summary_status_must_be_known(tmp_path):
    tracker = open_run(tmp_path, {}, {"mode": "disabled"})
    with pytest.raises(ValueError, match="status"):
        tracker.summary(dict(status="done"))
