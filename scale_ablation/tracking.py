"""Run files (config.json, metrics.jsonl, summary.json) and the Weights & Biases writer.

The run files are the record of truth: they are written whatever the W&B mode, by plain
Python, and the report reads only them. W&B is a view on top: any failure there is logged
once and the writer turns into a no-op, so a W&B outage never stops training.

wandb is imported lazily: a disabled tracker (non-zero hosts, `wandb.mode=disabled`) and the
report never pay its ~0.7 s import or its background service.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import netrc
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from absl import logging

from scale_ablation import wandb_offline

WANDB_MODES = ("auto", "online", "offline", "disabled")
RUN_STATUSES = ("completed", "diverged", "failed", "preempted")
SUMMARY_FIELDS = (
    "status",
    "steps_completed",
    "final_train_loss",
    "final_val_loss",
    "final_val_bpb",
    "diverged_at_step",
    "wall_seconds",
    "tokens_per_second",
    "wandb_run_id",
)
REDACTED = "<redacted>"

# Singular `token` only, so that `tokens_per_second`, `max_tokens` or `tokenizer` survive.
_SECRET_KEY = re.compile(r"api_?key|secret|passw(?:or)?d|credential|token(?![a-z])", re.IGNORECASE)
_SECRET_ENV_NAME = re.compile(
    r"API_?KEY|(?:^|_)KEY$|(?:^|_)TOKEN(?:_|$)|SECRET|PASSW(?:OR)?D|CREDENTIAL", re.IGNORECASE
)
_MIN_SECRET_LENGTH = 8  # shorter values ("true", "1") would redact innocent strings

# A server that does not answer within this long costs the run its W&B view, not its time.
_WANDB_INIT_TIMEOUT_SECONDS = 30.0
_DEFAULT_WANDB_HOST = "https://api.wandb.ai"
# How long finish() waits for wandb-core to close an offline run's .wandb file (~1-4 ms here).
_TRANSACTION_LOG_CLOSE_TIMEOUT_SECONDS = 10.0


# --- JSON-safe values -------------------------------------------------------------------------


def _plain(value: Any, *, nonfinite_to_none: bool, strict: bool = True) -> Any:
    """Python scalars, lists and str-keyed dicts from numpy/jax values.

    JSON files get `nonfinite_to_none=True`: NaN/Infinity tokens are not JSON and many readers
    reject them, so a diverged loss is written as null. `strict=False` writes other objects
    (a Path in a config) as their str() instead of raising.
    """

    def convert(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, (str, bool, int)) or value is None:
            return value
        if isinstance(value, float):
            return None if nonfinite_to_none and not math.isfinite(value) else value
        if hasattr(value, "__array__"):  # numpy and jax scalars and arrays, without importing jax
            return convert(np.asarray(value).tolist())
        if not strict:
            return str(value)
        raise TypeError(f"cannot log {type(value).__name__} {value!r}: not a number or string")

    return convert(value)


def _json_line(value: Any) -> str:
    return json.dumps(_plain(value, nonfinite_to_none=True), allow_nan=False)


def _write_text_atomic(path: Path, text: str) -> None:
    """A reader (or a crash) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json_atomic(path: Path, value: Any) -> None:
    plain = _plain(value, nonfinite_to_none=True, strict=False)
    text = json.dumps(plain, indent=2, sort_keys=True, allow_nan=False)
    _write_text_atomic(path, text + "\n")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


# --- secrets ----------------------------------------------------------------------------------


def _secret_env_values() -> list[str]:
    return [
        value
        for name, value in os.environ.items()
        if _SECRET_ENV_NAME.search(name) and len(value) >= _MIN_SECRET_LENGTH
    ]


def scrub_secrets(config: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `config` with credentials removed, safe to write to disk and to W&B.

    Keys naming a credential (api_key, apikey, secret, password, passwd, credential, or the
    word `token` -- `tokens_per_second` and `tokenizer` are kept) are dropped; strings that
    contain the value (>= 8 characters) of a credential-like environment variable
    (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...) become "<redacted>". Accepts
    `ml_collections.ConfigDict` too (anything with `to_dict()`).
    """
    secrets = _secret_env_values()

    def scrub(value: Any) -> Any:
        if hasattr(value, "to_dict") and not isinstance(value, Mapping):
            value = value.to_dict()
        if isinstance(value, Mapping):
            return {k: scrub(v) for k, v in value.items() if not _SECRET_KEY.search(str(k))}
        if isinstance(value, (list, tuple)):
            return type(value)(scrub(v) for v in value)
        if isinstance(value, str) and any(secret in value for secret in secrets):
            return REDACTED
        return copy.deepcopy(value)

    return scrub(config)


# --- run files --------------------------------------------------------------------------------


class RunFiles:
    """The run directory's config.json, metrics.jsonl and summary.json.

    Nothing is created until the first write, so a disabled tracker leaves no trace.
    """

    def __init__(self, workdir: str | os.PathLike) -> None:
        self.workdir = Path(workdir)
        self.config_path = self.workdir / "config.json"
        self.metrics_path = self.workdir / "metrics.jsonl"
        self.summary_path = self.workdir / "summary.json"
        self._tail_checked = False

    def write_config(self, config: Mapping[str, Any]) -> None:
        _write_json_atomic(self.config_path, scrub_secrets(config))

    def read_config(self) -> dict[str, Any] | None:
        return _read_json(self.config_path)

    def append_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Appends `{"step": step, **metrics}` as one line, on disk when this returns."""
        row = {"step": int(step)}
        row.update((k, v) for k, v in metrics.items() if k != "step")
        line = _json_line(row) + "\n"
        if not self._tail_checked:
            self._drop_partial_last_line()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())  # a line is small; losing logged steps to a kill is worse

    def _drop_partial_last_line(self) -> None:
        # A process killed mid-write leaves a line without its newline; appending to it would
        # glue the next row onto garbage.
        self._tail_checked = True
        if not self.metrics_path.exists():
            return
        with open(self.metrics_path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            f.truncate(f.read().rfind(b"\n") + 1)

    def read_metrics(self) -> list[dict[str, Any]]:
        """All logged rows in order; a truncated last line (killed process) is skipped.

        A damaged line elsewhere raises ValueError: that is corruption, not a kill.
        """
        try:
            lines = self.metrics_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        rows = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                if number == len(lines):
                    break
                raise ValueError(f"{self.metrics_path}:{number}: damaged line: {error}") from None
        return rows

    def truncate_metrics_after(self, step: int) -> None:
        """Drops rows after `step`, so a run resumed from a checkpoint at `step` has no duplicates."""
        if not self.metrics_path.exists():
            return
        rows = [row for row in self.read_metrics() if row["step"] <= step]
        _write_text_atomic(self.metrics_path, "".join(_json_line(row) + "\n" for row in rows))
        self._tail_checked = True

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        _write_json_atomic(self.summary_path, summary)

    def read_summary(self) -> dict[str, Any] | None:
        return _read_json(self.summary_path)


# --- Weights & Biases -------------------------------------------------------------------------


def _has_wandb_credentials() -> bool:
    """Whether wandb would find credentials, judged from local files only (no network)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    # Same lookup order as wandb's own (sdk/lib/wbauth/wbnetrc.py): $NETRC, ~/.netrc, ~/_netrc.
    candidates = [os.environ["NETRC"]] if os.environ.get("NETRC") else ["~/.netrc", "~/_netrc"]
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or _DEFAULT_WANDB_HOST).netloc
    for candidate in candidates:
        path = Path(candidate).expanduser()
        if not path.is_file():
            continue
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            return False  # wandb would not read it either
        return bool(entry and entry[2])
    return False


def resolve_wandb_mode(mode: str) -> str:
    """'online' | 'offline' | 'disabled' for a `wandb.mode` config value; never touches the network.

    'auto' follows an explicit WANDB_MODE environment variable, else goes online when the user
    is logged in (WANDB_API_KEY, or a .netrc entry for the W&B host) and offline otherwise.
    """
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb.mode must be one of {', '.join(WANDB_MODES)}; got {mode!r}")
    if mode != "auto":
        return mode
    env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
    # wandb still accepts the legacy spellings "dryrun" and "run".
    if env_mode in ("offline", "dryrun"):
        return "offline"
    if env_mode == "disabled":
        return "disabled"
    if env_mode in ("online", "run"):
        return "online"
    return "online" if _has_wandb_credentials() else "offline"


class WandbWriter:
    """One W&B run for one run directory; degrades to a no-op on any W&B error.

    The run id is kept in `workdir/wandb_run_id.txt`, so a run resumed from its checkpoint
    continues the same W&B run. Files go under `workdir/wandb/`. Mode 'disabled' creates
    nothing and never imports wandb.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        config: Mapping[str, Any],
        *,
        mode: str,
        project: str,
        entity: str = "",
        group: str = "",
        job_type: str = "train",
        tags: Sequence[str] = (),
        name: str | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.run_id_path = self.workdir / "wandb_run_id.txt"
        self.run_id: str | None = None
        self.run_dir: Path | None = None  # workdir/wandb/<offline-run|run>-<time>-<id>
        self._run: Any = None
        mode = resolve_wandb_mode(mode)
        if mode == "disabled":
            return
        # wandb wants None, not "", for "not set".
        run_fields = {
            "project": project or None,
            "entity": entity or None,
            "group": group or None,
            "job_type": job_type or None,
            "tags": list(tags) or None,
            "name": name or None,
        }
        try:
            self._start(config, mode, run_fields)
        except Exception as error:
            self._give_up("init", error)

    @property
    def active(self) -> bool:
        return self._run is not None

    def _start(self, config: Mapping[str, Any], mode: str, run_fields: dict[str, Any]) -> None:
        import wandb

        previous_id = (
            self.run_id_path.read_text().strip() if self.run_id_path.exists() else None
        ) or None
        if os.environ.get("WANDB_MODE") == "":
            # An exported-but-empty WANDB_MODE means "unset" to us; wandb's settings reject it.
            del os.environ["WANDB_MODE"]
        settings = wandb.Settings(
            mode=mode,
            init_timeout=_WANDB_INIT_TIMEOUT_SECONDS,
            console="off",  # absl already logs to stderr; capturing it costs a thread
            quiet=True,  # no run-history sparklines per run: a sweep prints dozens of runs
            save_code=False,
            # Writing requirements.txt (a scan of installed packages) was ~60 of the ~80 ms
            # per init measured here; git, metadata and system stats cost about nothing.
            x_save_requirements=False,
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            dir=self.workdir,
            **run_fields,
            config=scrub_secrets(config),
            id=previous_id,
            resume="allow" if previous_id else None,
            # Several runs may live in one process (a sweep); "create_new" keeps them
            # independent instead of returning or finishing the previous one.
            reinit="create_new",
            settings=settings,
        )
        self._run = run
        self.run_id = run.id
        self.run_dir = Path(run.sync_dir)
        if run.id != previous_id:
            _write_text_atomic(self.run_id_path, run.id + "\n")

    def _give_up(self, stage: str, error: Exception) -> None:
        logging.warning(
            "W&B %s failed (%s: %s); continuing without W&B. The run files in %s are complete.",
            stage,
            type(error).__name__,
            error,
            self.workdir,
        )
        run, self._run = self._run, None
        if run is not None and stage != "finish":
            # Release wandb's resources for this run; its data so far stays on disk.
            with contextlib.suppress(Exception):
                run.finish(exit_code=1)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._run is None:
            return
        try:
            self._run.log(_plain(metrics, nonfinite_to_none=False), step=int(step))
        except Exception as error:
            self._give_up("log", error)

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Logs a wandb.Table (a sweep's summary, say) at the run's current step."""
        if self._run is None:
            return
        try:
            import wandb

            data = [_plain(list(row), nonfinite_to_none=False) for row in rows]
            self._run.log({key: wandb.Table(columns=list(columns), data=data)})
        except Exception as error:
            self._give_up("log_table", error)

    def update_summary(self, fields: Mapping[str, Any]) -> None:
        if self._run is None:
            return
        try:
            self._run.summary.update(_plain(fields, nonfinite_to_none=False, strict=False))
        except Exception as error:
            self._give_up("summary", error)

    def finish(self, exit_code: int = 0) -> None:
        if self._run is None:
            return
        run, self._run = self._run, None
        try:
            offline = run.settings.mode in ("offline", "dryrun")
            run.finish(exit_code=exit_code)
        except Exception as error:
            self._give_up("finish", error)
            return
        if offline:
            self._wait_for_transaction_log()

    def _wait_for_transaction_log(self) -> None:
        # wandb 0.31's run.finish() only *informs* wandb-core that the run is done and returns;
        # the .wandb file is flushed and closed a few ms later. Waiting makes "finished" mean
        # "on disk" for whoever reads or syncs the run next, in this process or another.
        deadline = time.monotonic() + _TRANSACTION_LOG_CLOSE_TIMEOUT_SECONDS
        pause = 0.001
        while time.monotonic() < deadline:
            try:
                if wandb_offline.last_record_type(self.run_dir) == "exit":
                    return
            except (OSError, ValueError):
                pass  # not created or not flushed yet
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        logging.warning("W&B run files in %s were not closed after finish()", self.run_dir)


# --- what the training loop uses --------------------------------------------------------------


def _wandb_field(wandb_config: Any, name: str, default: Any) -> Any:
    value = wandb_config.get(name, default) if hasattr(wandb_config, "get") else default
    return default if value is None else value


class Tracker:
    """Run files plus the W&B writer, behind the calls the training loop makes.

    `enable=False` (every process but the first in a multi-host run) makes every method a
    no-op that writes nothing.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        config: Mapping[str, Any],
        wandb_config: Mapping[str, Any],
        *,
        resume_step: int | None = None,
        enable: bool = True,
    ) -> None:
        self.enabled = enable
        self.files = RunFiles(workdir)
        if not enable:
            self.wandb = WandbWriter(workdir, {}, mode="disabled", project="")
            return
        mode = resolve_wandb_mode(_wandb_field(wandb_config, "mode", "auto"))  # fail before writing
        self.files.write_config(config)
        if resume_step is not None:
            self.files.truncate_metrics_after(resume_step)
        self.wandb = WandbWriter(
            workdir,
            config,
            mode=mode,
            project=_wandb_field(wandb_config, "project", "scale_ablation"),
            entity=_wandb_field(wandb_config, "entity", ""),
            group=_wandb_field(wandb_config, "group", ""),
            job_type=_wandb_field(wandb_config, "job_type", "train"),
            tags=tuple(_wandb_field(wandb_config, "tags", ())),
            # Sweep run directories are named after their settings: a readable W&B name.
            name=_wandb_field(wandb_config, "name", "") or Path(workdir).resolve().name,
        )

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        self.files.append_metrics(step, metrics)  # first: it must survive a W&B failure
        self.wandb.log(step, metrics)

    def write_summary(self, **fields: Any) -> None:
        """Writes summary.json: the standard fields (missing ones as null) plus any extras."""
        if not self.enabled:
            return
        status = fields.get("status")
        if status not in RUN_STATUSES:
            raise ValueError(f"summary status must be one of {RUN_STATUSES}; got {status!r}")
        summary = dict.fromkeys(SUMMARY_FIELDS)
        summary.update(fields)
        summary["wandb_run_id"] = self.wandb.run_id or fields.get("wandb_run_id")
        self.files.write_summary(summary)
        self.wandb.update_summary(
            {k: v for k, v in summary.items() if v is not None and k != "wandb_run_id"}
        )

    def close(self, exit_code: int = 0) -> None:
        if self.enabled:
            self.wandb.finish(exit_code)
