"""Weights & Biases as a `Tracker`: one W&B run per run directory, a no-op after any W&B error.

W&B is a view on top of the run files: a failure there is logged once and the tracker turns
into a no-op, so a W&B outage never stops training. wandb is imported lazily: a disabled tracker
(non-zero hosts, `wandb.mode=disabled`) never pays its ~0.7 s import or its background service.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import netrc
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from absl import logging

from scale_ablation.records import jsonfiles, wandb_offline
from scale_ablation.records.redaction import scrub_secrets

WANDB_MODES = ("auto", "online", "offline", "disabled")
_DEFAULT_WANDB_HOST = "https://api.wandb.ai"
# W&B servers (base URLs) that did not answer wandb.init in this process, with the error. A
# server that timed out once is not waited for again: every later run of the process (a
# sweep's, the report's) logs offline at once. A record of what happened, not a setting.
_UNREACHABLE: dict[str, str] = {}
# How long finish() waits for wandb-core to close an offline run's .wandb file (~1-4 ms here).
_TRANSACTION_LOG_CLOSE_TIMEOUT_SECONDS = 10.0


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


@dataclasses.dataclass(frozen=True)
class WandbSettings:
    """A config's `wandb` section, read the same way by runs and by the report."""

    mode: str = "auto"
    project: str = "scale_ablation"
    entity: str = ""
    group: str = ""
    job_type: str = "train"
    tags: tuple[str, ...] = ()
    name: str = ""
    # A server that does not answer within this long costs the run its W&B view, not its
    # time: the run logs offline (and so does every later run of the process).
    init_timeout: float = 30.0

    @classmethod
    def of(cls, section: Mapping[str, Any] | None, **overrides: Any) -> WandbSettings:
        """From a config's `wandb` dict (missing or null fields take the defaults)."""
        names = {field.name for field in dataclasses.fields(cls)}
        given = {k: v for k, v in dict(section or {}).items() if k in names and v is not None}
        given["tags"] = tuple(given.get("tags", ()))
        return cls(**{**given, **overrides})

    def run_fields(self) -> dict[str, Any]:
        """wandb.init's arguments; wandb wants None, not "", for "not set"."""
        return {"project": self.project or None, "entity": self.entity or None,
                "group": self.group or None, "job_type": self.job_type or None,
                "tags": list(self.tags) or None, "name": self.name or None}


def _guarded(stage: str) -> Callable:
    """A WandbTracker method that does nothing without a run, and gives W&B up on any error."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def guarded(self: WandbTracker, *args: Any, **kwargs: Any) -> None:
            if self._run is None:
                return
            try:
                method(self, *args, **kwargs)
            except Exception as error:  # W&B must never stop a run
                self._give_up(stage, error)

        return guarded

    return decorate


class WandbTracker:
    """One W&B run for one run directory.

    The run id is kept in `workdir/wandb_run_id.txt`, so a run resumed from its checkpoint
    continues the same W&B run. Files go under `workdir/wandb/`. Mode 'disabled' creates
    nothing and never imports wandb. `one_offline_folder`: offline, the run keeps one folder,
    its latest (wandb starts a new `offline-run-<time>-<id>` folder at every resume): for a run
    that logs everything again each time, such as the report's summary run, whose older
    folders would otherwise pile up, all with one id, all matched by `wandb sync`'s glob.
    """

    def __init__(self, workdir: str | os.PathLike, config: Mapping[str, Any],
                 settings: WandbSettings, one_offline_folder: bool = False) -> None:
        self.workdir = Path(workdir)
        self._one_offline_folder = one_offline_folder
        self.run_id_path = self.workdir / "wandb_run_id.txt"
        self.run_id: str | None = None
        self.run_dir: Path | None = None  # workdir/wandb/<offline-run|run>-<time>-<id>
        self._run: Any = None
        mode = resolve_wandb_mode(settings.mode)
        if mode == "disabled":
            return
        server = os.environ.get("WANDB_BASE_URL") or _DEFAULT_WANDB_HOST
        if mode == "online" and server in _UNREACHABLE:
            logging.warning("W&B server %s did not answer earlier in this process (%s): logging "
                            "%s offline; upload later with `wandb sync %s`", server,
                            _UNREACHABLE[server], self.workdir, self.workdir / "wandb")
            mode = "offline"
        try:
            self._start(config, mode, settings)
        except Exception as error:  # W&B must never stop a run
            if mode != "online" or type(error).__name__ != "CommError":
                self._give_up("init", error)
                return
            _UNREACHABLE[server] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            logging.warning("W&B server %s did not answer within %.0f s (%s): logging this and "
                            "later runs of this process offline; upload later with `wandb sync "
                            "%s`", server, settings.init_timeout, _UNREACHABLE[server],
                            self.workdir / "wandb")
            try:
                self._start(config, "offline", settings)
            except Exception as offline_error:
                self._give_up("init", offline_error)

    @property
    def active(self) -> bool:
        return self._run is not None

    def _start(self, config: Mapping[str, Any], mode: str, settings: WandbSettings) -> None:
        import wandb

        previous_id = (
            self.run_id_path.read_text().strip() if self.run_id_path.exists() else None
        ) or None
        wandb_settings = wandb.Settings(
            mode=mode,
            init_timeout=float(settings.init_timeout),
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
            **settings.run_fields(),
            config=scrub_secrets(config),
            id=previous_id,
            resume="allow" if previous_id else None,
            # Several runs may live in one process (a sweep); "create_new" keeps them
            # independent instead of returning or finishing the previous one.
            reinit="create_new",
            settings=wandb_settings,
        )
        self._run = run
        # The reviewer's summary of a run: its best validation numbers, not whichever came last.
        for pattern, best in (("val/loss*", "min"), ("val/bpb*", "min"),
                              ("val/accuracy*", "max")):
            run.define_metric(pattern, summary=best)
        self.run_id = run.id
        self.run_dir = Path(run.sync_dir)
        if run.id != previous_id:
            jsonfiles.write_text_atomic(self.run_id_path, run.id + "\n")
        if self._one_offline_folder and mode == "offline":
            for older in self.run_dir.parent.glob(f"offline-run-*-{run.id}"):
                if older != self.run_dir:
                    shutil.rmtree(older, ignore_errors=True)

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

    @_guarded("log")
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._run.log(jsonfiles.plain(metrics, nonfinite_to_none=False), step=int(step))

    @_guarded("log_table")
    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Logs a wandb.Table (a sweep's summary, say) at the run's current step."""
        import wandb

        data = [jsonfiles.plain(list(row), nonfinite_to_none=False) for row in rows]
        self._run.log({key: wandb.Table(columns=list(columns), data=data)})

    @_guarded("log_images")
    def log_images(self, images: Mapping[str, str | os.PathLike]) -> None:
        """PNG files (a report's plots, say) as W&B images, one key each."""
        import wandb

        self._run.log({key: wandb.Image(str(path)) for key, path in images.items()})

    @_guarded("summary")
    def summary(self, fields: Mapping[str, Any]) -> None:
        """The run's W&B summary: the set fields of summary.json, without the run's own id."""
        fields = {k: v for k, v in fields.items() if v is not None and k != "wandb_run_id"}
        self._run.summary.update(jsonfiles.plain(fields, nonfinite_to_none=False, strict=False))

    @_guarded("finish")
    def finish(self, exit_code: int = 0) -> None:
        run, self._run = self._run, None
        offline = run.settings.mode in ("offline", "dryrun")
        run.finish(exit_code=exit_code)
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
