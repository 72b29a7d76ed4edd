"""claims.md: each declared claim with its rule, its computed verdict and the numbers behind it."""

from __future__ import annotations

from collections.abc import Sequence

from scale_ablation.analysis import verdicts
from scale_ablation.analysis.claims import Claim
from scale_ablation.records import jsonfiles, study_store


def _refine_flags(records_dir: str) -> str:
    """A refined sweep's grid includes refined.json's points, so the command that reproduces it
    names --refine, and the rounds recorded: --refine alone would go on to its default number
    of rounds, training LRs the study never ran."""
    refined = study_store.study_json(records_dir, "refined.json")
    if refined is None:
        return ""
    rounds = len(refined.get("rounds", []))
    return f" --refine --refine_rounds={rounds}" if rounds else " --refine"


def write_claims(declared: Sequence[Claim], spec: str, sweep_dir: str, rows: list[dict],
                 path: str, run_count: tuple[int, int] | None = None,
                 records_dir: str | None = None) -> bool:
    """Write claims.md for the experiment's claims; False (nothing written) when it has none.
    `run_count`: (finished, all) runs of the sweep's run set; when some have no result, the
    count heads the file, since the verdicts rest on the finished ones alone. `records_dir`:
    where the sweep's records (refined.json) are read, a run directory or a study store's
    folder; default `sweep_dir`."""
    if not declared:
        return False
    refine = _refine_flags(records_dir or sweep_dir)
    lines = [f"# Claims tested by `{spec}`", "",
             f"Command: `python -m scale_ablation.sweep --config={spec} --workdir={sweep_dir}"
             f"{refine}`",
             "", "Verdicts are computed by scale_ablation/analysis/verdicts.py from the runs' "
             "files; every test of this study is one family, Holm-corrected.", ""]
    if run_count is not None and run_count[0] < run_count[1]:
        lines = [f"**{run_count[0]} of {run_count[1]} runs finished** (summary.md lists the "
                 "others): these verdicts rest on the finished runs alone.", "", *lines]
    caveats = verdicts.limits(rows, declared)
    if caveats:
        lines += ["**This sweep cannot support a verdict:** " + "; ".join(caveats) + ".", ""]
    for i, (claim, verdict) in enumerate(zip(declared, verdicts.judge_family(declared, rows),
                                             strict=True), 1):
        marks = [*caveats, *((verdict.at_init,) if verdict.at_init else ())]
        head = f"Verdict ({'; '.join(marks)})" if marks else "Verdict"
        lines += [f"## {i}. {claim.text}" + (f" ({claim.source})" if claim.source else ""), "",
                  f"Rule: {claim.rule.describe()}.", "",
                  f"{head}: **{verdict.verdict}**: {verdict.reason}.", ""]
        lines += [f"- {n}" for n in verdict.numbers] + [""]
    jsonfiles.write_text_atomic(path, "\n".join(lines))  # rejudge rewrites it in place
    return True
