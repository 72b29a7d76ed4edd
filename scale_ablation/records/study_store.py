r"""A study's runs as one Parquet file, `runs.parquet`: what a published study keeps of its sweep.

  python -m scale_ablation.records.study_store convert experiments/results/STUDY [--source=DIR]
  python -m scale_ablation.records.study_store extract experiments/results/STUDY runs/STUDY
  python -m scale_ablation.records.study_store count experiments/pending/STUDY

One row per run (`read_table`; `metrics_frame`: a row per logged row; `.to_pandas()`): its name, the
overrides the sweep gave it, config.json and summary.json (as JSON text, exact to the last bit:
floats are written as Python's round-trip repr), its logged metrics rows (a list of structs, one
field per metric key, typed float64, int64, bool, string or, for a key whose values mix types, JSON
text) and every step's training loss (train_losses.jsonl's lines). The file's metadata holds the
schema version, each row's keys in their logged order (null and absent stay apart) and the sweep's
own records (sweep.json, refined.json, byte for byte). zstd-compressed, page checksums on.

`load_runs(DIR)` is the one way runs are read for a report: from DIR/runs.parquet when DIR has
one, else from DIR's run directories (`run_files.RunFiles`), the same list either way. `convert`
writes the store from a sweep's run directories (default DIR/run_files) and refuses, before
anything is replaced, unless reading it back gives exactly what the directories give. `extract`
writes the run directories back (config.json, metrics.jsonl, summary.json, train_losses.jsonl,
sweep.json, refined.json), skipping runs already there: a sweep directory seeded from it trains
only what is missing. `count` prints how many runs a folder's store holds (0: it has none).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from scale_ablation.records import jsonfiles
from scale_ablation.records import metrics_rows as rm
from scale_ablation.records.run_files import FINISHED, STEP_LOSSES_FILE, RunFiles

STORE_FILE = "runs.parquet"
SCHEMA_VERSION = 1
SWEEP_FILE = "sweep.json"
STUDY_FILES = (SWEEP_FILE, "refined.json")  # the sweep's records beside its run directories
_META_KEY = b"scale_ablation.study_store"
_LOSSES = "train/loss"
_ARROW_TYPES = {"float": pa.float64(), "int": pa.int64(), "bool": pa.bool_(),
                "str": pa.string(), "json": pa.string()}


@dataclasses.dataclass
class RunRecord:
    """One run's record files, read."""

    name: str
    overrides: dict[str, Any]
    config: dict[str, Any]
    summary: dict[str, Any] | None  # None: no summary.json (a run never finished)
    metrics: list[dict[str, Any]]
    train_losses: list[dict[str, Any]] | None  # train_losses.jsonl's lines; None: no file

    def as_loaded(self) -> dict[str, Any]:
        """The run as the report reads it (`load_runs`)."""
        return {"name": self.name, "overrides": self.overrides, "config": self.config,
                "summary": self.summary or {"status": "interrupted"}, "metrics": self.metrics}


@dataclasses.dataclass
class Study:
    """A sweep's runs and its own record files (name -> text)."""

    runs: list[RunRecord]
    files: dict[str, str]


def _grid_entries(sweep_dir: str) -> list[tuple[str, dict]]:
    """(name, overrides) of the sweep's runs in sweep.json's order, else the directories that
    hold a config.json (no overrides known)."""
    grid = jsonfiles.read_json(os.path.join(sweep_dir, SWEEP_FILE))
    if grid is not None:
        return [(r["name"], r["overrides"]) for r in grid["runs"]]
    return [(name, {}) for name in sorted(os.listdir(sweep_dir))
            if os.path.exists(os.path.join(sweep_dir, name, "config.json"))]


def _read_step_losses(path: str) -> list[dict[str, Any]] | None:
    """train_losses.jsonl's intact lines, in order (reading stops where `StepLosses` stops)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")[:-1]  # the last: torn or ""
    except FileNotFoundError:
        return None
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break
        if list(record) != ["step", _LOSSES]:
            break
        out.append(record)
    return out


def read_run_dirs(sweep_dir: str, finished_only: bool = False) -> Study:
    """The sweep's runs as their directories hold them (runs with no config.json are not
    runs yet); `finished_only`: completed or diverged runs alone, what a study publishes."""
    runs = []
    for name, overrides in _grid_entries(sweep_dir):
        files = RunFiles(os.path.join(sweep_dir, name))
        config = files.read_config()
        if config is None:
            continue
        summary = files.read_summary()
        if finished_only and (summary or {}).get("status") not in FINISHED:
            continue
        runs.append(RunRecord(name, overrides, config, summary, files.read_result_metrics(),
                              _read_step_losses(os.path.join(files.workdir, STEP_LOSSES_FILE))))
    texts = {}
    for file in STUDY_FILES:
        if os.path.isfile(path := os.path.join(sweep_dir, file)):
            with open(path, encoding="utf-8", newline="") as f:
                texts[file] = f.read()
    return Study(runs, texts)


def _kind(values: Iterable[Any]) -> str:
    """The one column type all of a key's values (None aside) fit; "json" when they mix."""
    kinds = {"bool" if isinstance(v, bool) else
             "int" if isinstance(v, int) and -2**63 <= v < 2**63 else
             "float" if isinstance(v, float) else
             "str" if isinstance(v, str) else "json" for v in values if v is not None}
    return kinds.pop() if len(kinds) == 1 else "json"


def _metrics_layout(runs: Sequence[RunRecord]) -> tuple[list[tuple[str, str]], list[tuple[int, ...]]]:
    """(key, kind) of every metric key in first-logged order, and the distinct key orders."""
    values: dict[str, list] = {}
    layouts: dict[tuple[str, ...], None] = {}
    for run in runs:
        for row in run.metrics:
            layouts.setdefault(tuple(row))
            for key, value in row.items():
                values.setdefault(key, []).append(value)
    keys = [(key, _kind(v)) for key, v in values.items()]
    index = {key: i for i, (key, _) in enumerate(keys)}
    return keys, [tuple(index[k] for k in layout) for layout in layouts]


def _coded(value: Any, kind: str, code: Callable[[Any], Any]) -> Any:
    """A value of a "json" column through `code` (json.dumps or json.loads); others as they are."""
    return code(value) if kind == "json" and value is not None else value


def to_table(study: Study) -> pa.Table:
    """The study as one Arrow table, a row per run (its layout in the schema's metadata)."""
    keys, layouts = _metrics_layout(study.runs)
    layout_ids = {tuple(keys[i][0] for i in layout): n for n, layout in enumerate(layouts)}
    # Parquet cannot hold a struct without fields: runs that logged no row get a placeholder.
    row_type = pa.struct([(key, _ARROW_TYPES[kind]) for key, kind in keys]
                         or [("step", pa.int64())])
    losses_type = pa.struct([("step", pa.int64()), (_LOSSES, pa.list_(pa.float64()))])
    kinds = dict(keys)
    columns = {
        "name": pa.array([r.name for r in study.runs], pa.string()),
        "overrides": pa.array([json.dumps(r.overrides) for r in study.runs], pa.string()),
        "config": pa.array([json.dumps(r.config) for r in study.runs], pa.string()),
        "summary": pa.array([_coded(r.summary, "json", json.dumps) for r in study.runs],
                            pa.string()),
        "metrics": pa.array([[{k: _coded(v, kinds[k], json.dumps) for k, v in row.items()}
                              for row in r.metrics] for r in study.runs], pa.list_(row_type)),
        "metrics_layout": pa.array([[layout_ids[tuple(row)] for row in r.metrics]
                                    for r in study.runs], pa.list_(pa.int32())),
        "train_losses": pa.array([r.train_losses for r in study.runs], pa.list_(losses_type)),
    }
    meta = {"schema_version": SCHEMA_VERSION, "metrics_keys": keys,
            "metrics_layouts": [list(layout) for layout in layouts],
            "study_files": {name: base64.b64encode(pa.compress(text.encode(), "zstd",
                                                               asbytes=True)).decode()
                            for name, text in study.files.items()},
            "study_file_sizes": {name: len(text.encode()) for name, text in study.files.items()}}
    return pa.table(columns).replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})


def write_store(study: Study, path: str) -> None:
    """Write the study to `path` (replaced whole: a reader sees the old file or the new)."""
    tmp = f"{path}.tmp{os.getpid()}"
    pq.write_table(to_table(study), tmp, compression="zstd", compression_level=19,
                   write_page_checksum=True, use_dictionary=["name"])
    os.replace(tmp, path)


def _metadata(schema: pa.Schema, path: str) -> dict[str, Any]:
    raw = (schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise ValueError(f"{path} is not a study store (no {_META_KEY.decode()} metadata)")
    meta = json.loads(raw)
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: study store schema version {meta.get('schema_version')}; "
                         f"this code reads version {SCHEMA_VERSION}")
    return meta


def _study_files(meta: dict[str, Any]) -> dict[str, str]:
    return {name: pa.decompress(base64.b64decode(blob), meta["study_file_sizes"][name],
                                "zstd", asbytes=True).decode()
            for name, blob in meta["study_files"].items()}


def _rows(table: pa.Table, meta: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Each run's metrics rows, each row's keys in its logged order."""
    keys = meta["metrics_keys"]
    layouts = [[keys[i] for i in layout] for layout in meta["metrics_layouts"]]
    metrics = table.column("metrics").combine_chunks()
    flat = pc.list_flatten(metrics)
    fields = {key: flat.field(i).to_pylist() for i, (key, _) in enumerate(keys)}
    layout_ids = pc.list_flatten(table.column("metrics_layout").combine_chunks()).to_pylist()
    out, at = [], 0
    for count in pc.list_value_length(metrics).to_pylist():
        out.append([{key: _coded(fields[key][i], kind, json.loads)
                     for key, kind in layouts[layout_ids[i]]}
                    for i in range(at, at + count)])
        at += count
    return out


def read_store(path: str, metrics: bool = True) -> Study:
    """The study the store at `path` holds; `metrics=False` leaves the metrics rows and the
    step losses out (empty) for a reader that needs the runs' summaries only."""
    try:
        table = pq.read_table(path, columns=None if metrics else ["name", "overrides", "config",
                                                                   "summary"])
    except (OSError, pa.ArrowInvalid) as error:
        raise ValueError(f"{path} is not a readable study store ({error})") from None
    meta = _metadata(table.schema, path)
    rows = _rows(table, meta) if metrics else [[] for _ in range(table.num_rows)]
    losses = table.column("train_losses").to_pylist() if metrics else [None] * table.num_rows
    runs = [RunRecord(name, json.loads(overrides), json.loads(config),
                      None if summary is None else json.loads(summary), run_rows, run_losses)
            for name, overrides, config, summary, run_rows, run_losses in zip(
                table.column("name").to_pylist(), table.column("overrides").to_pylist(),
                table.column("config").to_pylist(), table.column("summary").to_pylist(),
                rows, losses, strict=True)]
    return Study(runs, _study_files(meta))


def run_count(path: str) -> int:
    """How many runs the store at `path` holds (its footer alone is read)."""
    return pq.ParquetFile(path).metadata.num_rows


def read_table(path: str) -> pa.Table:
    """The store as an Arrow table (`to_pandas()` for pandas), a row per run."""
    table = pq.read_table(path)
    _metadata(table.schema, path)
    return table


def metrics_frame(path: str) -> pa.Table:
    """Every run's metrics rows as one flat table, a row per logged row: `run` (its name), then
    a column per metric key (null where the row did not log it; keys whose values mix types as
    JSON text). `.to_pandas()` for pandas."""
    table = read_table(path)
    metrics = table.column("metrics").combine_chunks()
    rows = pc.list_flatten(metrics)
    runs = pc.take(table.column("name").combine_chunks(), pc.list_parent_indices(metrics))
    keys = [key for key, _ in _metadata(table.schema, path)["metrics_keys"]]
    return pa.table([runs, *(rows.field(i) for i in range(len(keys)))], names=["run", *keys])


# --- what the report reads: a store if the folder has one, else its run directories


def store_path(sweep_dir: str) -> str | None:
    path = os.path.join(sweep_dir, STORE_FILE)
    return path if os.path.isfile(path) else None


def load_runs(sweep_dir: str) -> list[dict[str, Any]]:
    """Each run of the sweep: name, overrides, config, summary and metrics."""
    path = store_path(sweep_dir)
    study = read_store(path) if path else read_run_dirs(sweep_dir)
    return [run.as_loaded() for run in study.runs]


def study_file(sweep_dir: str, name: str) -> str | None:
    """The text of one of the sweep's records (sweep.json, refined.json), None if absent."""
    if (path := store_path(sweep_dir)) is not None:
        table = pq.read_table(path, columns=["name"])
        return _study_files(_metadata(table.schema, path)).get(name)
    try:
        with open(os.path.join(sweep_dir, name), encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        return None


def study_json(sweep_dir: str, name: str) -> Any:
    """One of the sweep's records parsed (None if absent); ValueError naming a damaged one."""
    text = study_file(sweep_dir, name)
    try:
        return None if text is None else json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{os.path.join(sweep_dir, name)} is damaged (not JSON: {error})") from None


def recorded_summaries(sweep_dir: str) -> dict[str, dict[str, Any] | None]:
    """Run name -> its summary (None: none written) for every run with a config."""
    if (path := store_path(sweep_dir)) is not None:
        return {run.name: run.summary for run in read_store(path, metrics=False).runs}
    return {name: RunFiles(os.path.join(sweep_dir, name)).read_summary()
            for name in sorted(os.listdir(sweep_dir))
            if os.path.exists(os.path.join(sweep_dir, name, "config.json"))}


def _as_json(study: Study) -> str:
    """The study as JSON text: equal texts are equal to the last bit (floats as their repr),
    with key order, int against float and NaN told apart."""
    return json.dumps([dataclasses.asdict(run) for run in study.runs] + [study.files])


def convert(source: str, dest_dir: str) -> tuple[str, int]:
    """Write DEST_DIR/runs.parquet from SOURCE's run directories; return (path, runs). Refuses
    (ValueError, nothing replaced) unless the store reads back as exactly what SOURCE holds."""
    if not os.path.isdir(source):
        raise ValueError(f"no such sweep directory: {source}")
    study = read_run_dirs(source)
    if not study.runs:
        raise ValueError(f"{source} holds no run with a config.json")
    os.makedirs(dest_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".store-", dir=dest_dir) as staging:
        staged = os.path.join(staging, STORE_FILE)
        write_store(study, staged)
        if _as_json(read_store(staged)) != _as_json(study):
            raise ValueError(f"{staged} does not read back as {source} holds it; not installed")
        os.replace(staged, path := os.path.join(dest_dir, STORE_FILE))
    return path, len(study.runs)


def write_run_dirs(study: Study, target: str) -> int:
    """Write each run's record files under TARGET (runs whose directory exists are left as
    they are) and the sweep's records where TARGET has none; return the runs written."""
    os.makedirs(target, exist_ok=True)
    written = 0
    for run in study.runs:
        if os.path.exists(workdir := os.path.join(target, run.name)):
            continue
        files = RunFiles(workdir)
        files.write_config(run.config)
        jsonfiles.write_text_atomic(files.metrics_path, "".join(
            rm.row_line(row) + "\n" for row in run.metrics))
        if run.summary is not None:
            files.write_summary(run.summary)
        if run.train_losses is not None:
            jsonfiles.write_text_atomic(os.path.join(workdir, STEP_LOSSES_FILE), "".join(
                jsonfiles.json_line(line) + "\n" for line in run.train_losses))
        written += 1
    for name, text in study.files.items():
        if not os.path.exists(path := os.path.join(target, name)):
            jsonfiles.write_text_atomic(path, text)
    return written


def main(argv: list[str]) -> int:
    usage = ("usage: python -m scale_ablation.records.study_store convert STUDY_DIR "
             "[--source=SWEEP_DIR] | extract STUDY_DIR TARGET_DIR | count STUDY_DIR")
    args = [a for a in argv[1:] if not a.startswith("--source=")]
    sources = [a.removeprefix("--source=") for a in argv[1:] if a.startswith("--source=")]
    try:
        if args[:1] == ["convert"] and len(args) == 2 and len(sources) <= 1:
            path, runs = convert(sources[0] if sources else os.path.join(args[1], "run_files"),
                                 args[1])
            print(f"{runs} runs in {path} ({os.path.getsize(path):,} bytes)")
        elif args[:1] == ["extract"] and len(args) == 3 and not sources:
            if (path := store_path(args[1])) is None:
                raise ValueError(f"{args[1]} holds no {STORE_FILE}")
            print(f"{write_run_dirs(read_store(path), args[2])} runs written to {args[2]}")
        elif args[:1] == ["count"] and len(args) == 2 and not sources:
            print(0 if (path := store_path(args[1])) is None else run_count(path))
        else:
            print(usage, file=sys.stderr)
            return 2
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
