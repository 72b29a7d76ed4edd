r"""The claims of every published study in one table, and the README's results index from it.

  python -m scale_ablation.claims_table           # writes the table and the README's index
  python -m scale_ablation.claims_table --check   # exit 1 naming what is stale; writes nothing

experiments/results/claims.csv and claims.parquet hold a row per claim of every study with a
claims.md: the study, the claim's number, its text and source (as the experiment file declares
them), its verdict and reason, whether the verdict line says it was decided at init, and the
numbers claims.md prints for it (`analysis.claims_markdown`; nothing is recomputed or retyped):
every number line, and the claim's deciding test, the one with the smallest Holm-adjusted p (its
line's effect with the 95% CI half-width, n and split; the test: difference, TOST against its
margin, or Fisher; its p and Holm p; empty for a claim judged without a test, such as a fitted
exponent or a band). `runs` is how many runs the
study's store holds (`records.study_store`).

The README's results index (the first table under "## Results") is generated from the table:
a row per study, in the order of experiments/results/index.csv, which holds the hand-written
part (the study's title, its verdicts before its rerun and why they changed), with the
supported and contradicted claims named, the not exercised (`analysis.acted`) and inconclusive
ones numbered.
"""

from __future__ import annotations

import csv
import io
import os
import pathlib
import re
import sys

import pandas as pd

from scale_ablation import report
from scale_ablation.analysis import at_init
from scale_ablation.analysis.acted import NOT_EXERCISED
from scale_ablation.records import study_store

RESULTS = pathlib.Path("experiments") / "results"
INDEX_FILE = "index.csv"
COLUMNS = ("study", "claim", "name", "source", "verdict", "decided_at_init", "reason",
           "effect", "ci", "n", "test", "p", "holm_p", "split", "deciding", "tests", "numbers",
           "runs")
_SECTION = re.compile(r"^## (\d+)\. (.*?)\n\n(.*?)(?=^## \d+\. |\Z)", re.M | re.S)
_VERDICT = re.compile(r"^Verdict[^\n]*?: \*\*(\w+(?: \w+)?)\*\*: (.*)$", re.M)  # "not exercised"
_SPEC = re.compile(r"^# Claims tested by `([^`]+)`")
# The unit between the interval and n ("bits per byte", "in log10") is optional.
_DELTA = re.compile(r"Δ = (?P<effect>\S+) ± (?P<ci>\S+)(?: [^(;]+)? \(n=(?P<n>\d+)\) on "
                    r"(?P<split>[^;]+);")
_COUNT = re.compile(r"(?P<k>\d+) of (?P<n>\d+) (?:solved|diverged)(?: on (?P<split>the [^(]+?))? ")
# Each test on a line: the difference test, TOST ("TOST ±m: p = ..."), Fisher's exact test.
_P = re.compile(r"(?:(?P<kind>TOST [^:]*): |(?P<fisher>Fisher) )?p = (?P<p>[^,]+), "
                r"Holm (?P<holm>[^\s;]+)")


def _test(line: str) -> dict | None:
    """A number line's test with the smallest Holm p (the line's effect, ci, n and split with
    that test's kind, p and Holm p), None for a line without one."""
    tests = [(float(m["holm"]), float(m["p"]), m["kind"] or m["fisher"] or "difference")
             for m in _P.finditer(line) if m["p"] != "n/a"]
    if not tests:
        return None
    holm, p, kind = min(tests)
    if found := _DELTA.search(line):
        effect, ci, n, split = (float(found["effect"]), float(found["ci"]), int(found["n"]),
                                found["split"])
    elif found := _COUNT.search(line):
        effect, ci, n, split = None, None, int(found["n"]), found["split"]
    else:
        effect, ci, n, split = None, None, None, None
    return {"effect": effect, "ci": ci, "n": n, "test": kind, "p": p, "holm_p": holm,
            "split": split}


def study_claims(study_dir: pathlib.Path) -> list[dict]:
    """A row per claim of the study's claims.md; ValueError when claims.md does not match the
    claims its experiment file declares (a stale or hand-edited claims.md)."""
    text = (study_dir / "claims.md").read_text()
    spec = _SPEC.search(text)
    if spec is None:
        raise ValueError(f"{study_dir / 'claims.md'} names no experiment")
    # The experiment file as the repository holds it, wherever this runs from.
    file, _, arg = spec.group(1).partition(":")
    declared = report.load_claims(str(study_dir.parents[2] / file) + (f":{arg}" if arg else ""))
    sections = _SECTION.findall(text)
    store = study_store.store_path(str(study_dir))
    runs = study_store.run_count(store) if store else None
    if len(sections) != len(declared):
        raise ValueError(f"{study_dir / 'claims.md'} has {len(sections)} claims, "
                         f"{spec.group(1)} declares {len(declared)}")
    rows = []
    for (number, heading, body), claim in zip(sections, declared, strict=True):
        if heading != claim.text + (f" ({claim.source})" if claim.source else ""):
            raise ValueError(f"{study_dir / 'claims.md'}: claim {number} is not "
                             f"{spec.group(1)}'s: {heading!r}")
        verdict = _VERDICT.search(body)
        numbers = [line[2:] for line in body.splitlines() if line.startswith("- ")]
        tests = [(t, line) for line in numbers if (t := _test(line)) is not None]
        deciding = min(tests, key=lambda t: t[0]["holm_p"]) if tests else ({}, "")
        rows.append({
            "study": study_dir.name, "claim": int(number), "name": claim.text,
            "source": claim.source, "verdict": verdict.group(1),
            "decided_at_init": (at_init.DECIDED_AT_INIT in verdict.group(0)
                                and at_init.PARTLY not in verdict.group(0)),
            "reason": verdict.group(2).removesuffix("."),
            **{key: deciding[0].get(key) for key in ("effect", "ci", "n", "test", "p",
                                                      "holm_p", "split")},
            "deciding": deciding[1], "tests": len(tests), "numbers": "\n".join(numbers),
            "runs": runs})
    return rows


def claims_frame(root: pathlib.Path) -> pd.DataFrame:
    """Every published study's claims, studies in index.csv's order, then any others by name."""
    order = [row["study"] for row in _index(root)]
    studies = sorted((p.parent for p in (root / RESULTS).glob("*/claims.md")),
                     key=lambda p: (order.index(p.name) if p.name in order else len(order),
                                    p.name))
    rows = [row for study in studies for row in study_claims(study)]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype({"claim": "int64", "n": "Int64", "runs": "Int64", "tests": "int64",
                         "decided_at_init": "bool"})


def _index(root: pathlib.Path) -> list[dict]:
    with open(root / RESULTS / INDEX_FILE, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def claims_csv(frame: pd.DataFrame) -> str:
    out = io.StringIO()
    frame.to_csv(out, index=False, lineterminator="\n", float_format="%.6g")
    return out.getvalue()


def _numbers(claims: list[int]) -> str:
    """1, 2, 3, 5 -> "1–3, 5"."""
    spans: list[list[int]] = []
    for claim in claims:
        if spans and claim == spans[-1][-1] + 1:
            spans[-1].append(claim)
        else:
            spans.append([claim])
    return ", ".join(f"{s[0]}–{s[-1]}" if len(s) > 2 else ", ".join(map(str, s)) for s in spans)


def _claims_cell(claims: pd.DataFrame) -> str:
    """The decided claims by number and name (init-decided ones marked), the rest by number."""
    parts = []
    for verdict in ("supported", "contradicted"):
        named = [f"{r.claim}. {r.name}" + (f" ({at_init.DECIDED_AT_INIT})" if r.decided_at_init else "")
                 for r in claims.itertuples() if r.verdict == verdict]
        if named:
            parts.append(f"**{verdict}**: " + "; ".join(named))
    if idle := [r.claim for r in claims.itertuples() if r.verdict == NOT_EXERCISED]:
        parts.append(f"{NOT_EXERCISED}: {_numbers(idle)}")
    if rest := [r.claim for r in claims.itertuples()
                if r.verdict not in ("supported", "contradicted", NOT_EXERCISED)]:
        parts.append(f"inconclusive: {_numbers(rest)}")
    return "; ".join(parts).replace("|", "\\|")


def index_table(frame: pd.DataFrame, root: pathlib.Path) -> str:
    """The README's results index: a row per study of index.csv that has claims."""
    lines = ["| study | runs | claims now (the table: [claims.csv](experiments/results/claims.csv))"
             " | write-up | before its rerun (from the old rows) | why it changed |",
             "|---|---|---|---|---|---|"]
    for entry in _index(root):
        claims = frame[frame["study"] == entry["study"]]
        if claims.empty:
            continue
        runs = claims["runs"].iloc[0]
        link = f"[{entry['study']}](experiments/results/{entry['study']}/README.md)"
        lines.append(f"| {entry['title']} | {'—' if pd.isna(runs) else runs} | "
                     f"{_claims_cell(claims)} | {link} | {entry['before_rerun']} | "
                     f"{entry['why_changed']} |")
    return "\n".join(lines) + "\n"


def _readme_with(readme: str, table: str) -> str:
    """`readme` with the first table under "## Results" replaced by `table`."""
    lines = readme.split("\n")
    start = next(i for i in range(lines.index("## Results"), len(lines))
                 if lines[i].startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[:start] + table.rstrip("\n").split("\n") + lines[end:])


def outputs(root: pathlib.Path) -> dict[pathlib.Path, str | pd.DataFrame]:
    """What this writes: the CSV's text, the Parquet's frame, the README's text."""
    frame = claims_frame(root)
    readme = (root / "README.md").read_text(encoding="utf-8")
    return {root / RESULTS / "claims.csv": claims_csv(frame),
            root / RESULTS / "claims.parquet": frame,
            root / "README.md": _readme_with(readme, index_table(frame, root))}


def stale(root: pathlib.Path) -> list[str]:
    """The generated files that differ from what the studies' claims.md give now."""
    out = []
    for path, want in outputs(root).items():
        if isinstance(want, pd.DataFrame):
            if not path.exists() or not pd.read_parquet(path).equals(want):
                out.append(str(path))
        elif not path.exists() or path.read_text(encoding="utf-8") != want:
            out.append(str(path))
    return out


def write(root: pathlib.Path) -> list[str]:
    """Write the table (CSV, Parquet) and the README's index; return the paths written."""
    written = []
    for path, want in outputs(root).items():
        if isinstance(want, pd.DataFrame):
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            want.to_parquet(tmp, compression="zstd", index=False)
            os.replace(tmp, path)
        else:
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            tmp.write_text(want, encoding="utf-8")
            os.replace(tmp, path)
        written.append(str(path))
    return written


def main(argv: list[str]) -> int:
    if argv[1:] not in ([], ["--check"]):
        print("usage: python -m scale_ablation.claims_table [--check]", file=sys.stderr)
        return 2
    root = repository()
    try:
        if argv[1:] == ["--check"]:
            if out := stale(root):
                print(f"stale (python -m scale_ablation.claims_table rewrites): {', '.join(out)}",
                      file=sys.stderr)
                return 1
            return 0
        for path in write(root):
            print(f"wrote {path}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def repository() -> pathlib.Path:
    """The repository this module belongs to."""
    return pathlib.Path(__file__).resolve().parent.parent


if __name__ == "__main__":
    sys.exit(main(sys.argv))
