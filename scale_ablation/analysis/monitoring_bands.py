r"""The article's monitoring bands (§5.2, §6.5) against where the best run of every published study
sits: normalised attention entropy > 0.8, max attention weight < 0.7, post-scale logit std in
0.8–1.2 (`model.diagnostics` logs all three per layer; the report's rows carry their mean over
layers at the last diagnostic step: `final_entropy_normalised`, `final_max_weight`,
`final_logit_std`).

  python -m scale_ablation.analysis.monitoring_bands [experiments/results]  # monitoring_bands.md

Rules, stated once:

- A study is a folder of `experiments/results` with a summary.csv (`records.summary_csv`).
- Its **best run** is the completed run of best primary validation metric (bits per byte, MQAR
  recall accuracy: `comparisons.primary_metric`) among those that trained smoothly (no failure
  kind, `analysis.failures`; in CSVs written before the taxonomy column, no divergence, spike or
  collapse step). It is the run a practitioner would keep, so a band that flags it flags health.
- A band's claim, "healthy runs sit inside the band", is **supported** when the best run of
  every study with the value sits inside, **contradicted** when most of them (more than half)
  sit outside (the band then flags the runs that train best), and **inconclusive** otherwise
  or when no study has the value (published CSVs made before `final_logit_std` existed).
- Beside each best run, the share of the study's smooth, completed runs inside the band.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis.claims import Verdict
from scale_ablation.records.summary_csv import read_summary_csv

RESULTS = "experiments/results"
OUT_NAME = "monitoring_bands.md"
STEP_KEYS = ("diverged_at_step", "spike_step", "collapse_step", "entropy_collapse_step")


@dataclasses.dataclass(frozen=True)
class HealthBand:
    name: str
    key: str  # run-row key
    low: float | None  # inside: low < value (None: no lower edge)
    high: float | None  # inside: value < high

    def inside(self, value: float) -> bool:
        return (self.low is None or value > self.low) and (self.high is None or value < self.high)

    def text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.name} in {self.low:g}–{self.high:g}"
        return f"{self.name} > {self.low:g}" if self.low is not None else f"{self.name} < {self.high:g}"


BANDS = (HealthBand("normalised entropy", "final_entropy_normalised", 0.8, None),
         HealthBand("max weight", "final_max_weight", None, 0.7),
         HealthBand("post-scale logit std", "final_logit_std", 0.8, 1.2))


def smooth(row: dict) -> bool:
    """Completed with no failure kind (the taxonomy column, or the older step columns)."""
    if row.get("status") != "completed":
        return False
    if "failures" in row:
        return not row["failures"]
    return all(row.get(key) is None for key in STEP_KEYS)


def best_run(rows: list[dict]) -> dict | None:
    """The smooth run of best primary validation metric, or None."""
    key, higher = cmp.primary_metric(rows)
    finished = [r for r in rows if smooth(r) and cmp.finished_value(r, key) is not None]
    if not finished:
        return None
    return (max if higher else min)(finished, key=lambda r: cmp.finished_value(r, key))


def _value(row: dict, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else None


@dataclasses.dataclass(frozen=True)
class Standing:
    """One study's best run against every band."""

    study: str
    best: dict
    metric: str
    values: dict[str, float | None]  # band name -> the best run's value
    share_inside: dict[str, tuple[int, int]]  # band name -> (smooth runs inside, with a value)


def standing(study: str, rows: list[dict]) -> Standing | None:
    best = best_run(rows)
    if best is None:
        return None
    smooth_rows = [r for r in rows if smooth(r)]
    shares = {}
    for band in BANDS:
        values = [v for r in smooth_rows if (v := _value(r, band.key)) is not None]
        shares[band.name] = (sum(band.inside(v) for v in values), len(values))
    return Standing(study, best, cmp.primary_metric(rows)[0],
                    {band.name: _value(best, band.key) for band in BANDS}, shares)


def load_standings(results: str = RESULTS) -> list[Standing]:
    """Every study under `results` (a folder with summary.csv), in name order."""
    out = []
    for path in sorted(glob.glob(os.path.join(results, "*", "summary.csv"))):
        found = standing(os.path.basename(os.path.dirname(path)), read_summary_csv(path))
        if found is not None:
            out.append(found)
    return out


def judge_band(band: HealthBand, standings: list[Standing]) -> Verdict:
    """The band's claim over the studies' best runs (the module's rule)."""
    placed = [(s.study, v, band.inside(v)) for s in standings
              if (v := s.values[band.name]) is not None]
    numbers = tuple(f"{study}: {v:.3f} ({'inside' if inside else 'outside'})"
                    for study, v, inside in placed)
    missing = [s.study for s in standings if s.values[band.name] is None]
    if missing:
        numbers += (f"no {band.key} in: {', '.join(missing)}",)
    if not placed:
        return Verdict("inconclusive", f"no study's rows have {band.key}", numbers)
    outside = sum(not inside for _, _, inside in placed)
    counted = f"{outside} of {len(placed)} studies' best runs sit outside {band.text()}"
    if outside == 0:
        return Verdict("supported", counted, numbers)
    if outside > len(placed) / 2:
        return Verdict("contradicted", counted, numbers)
    return Verdict("inconclusive", counted, numbers)


def verdict_lines(results: str = RESULTS) -> list[str]:
    """One line per band: the claim, its verdict and reason."""
    standings = load_standings(results)
    return [f"Healthy runs sit at {band.text()}: {v.verdict} ({v.reason})"
            for band in BANDS for v in [judge_band(band, standings)]]


def _cell(value: float | None, band: HealthBand) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" + ("" if band.inside(value) else " ✗")


def markdown(standings: list[Standing]) -> str:
    """The table (a row per study: its best run and where it sits) and a verdict per band."""
    head = ["study", "best run (smooth, by validation)", "metric",
            *(band.text() for band in BANDS), *(f"smooth runs inside: {band.name}"
                                                for band in BANDS[:2])]
    lines = ["# The article's monitoring bands against the studies' best runs", "",
             "Written by `python -m scale_ablation.analysis.monitoring_bands` from each study's "
             "summary.csv (rules: `scale_ablation/analysis/monitoring_bands.py`). "
             "✗: outside the band. "
             "Values are means over layers (and heads) at each run's last diagnostic step.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in standings:
        b = s.best
        run = f"{b['policy']}, d_k {b['d_k']}, lr {b['lr']:g}"
        shares = [f"{inside}/{n}" if n else "n/a"
                  for inside, n in (s.share_inside[band.name] for band in BANDS[:2])]
        lines.append("| " + " | ".join([s.study, run, f"{s.metric} {b[s.metric]:.3f}",
                                        *(_cell(s.values[band.name], band) for band in BANDS),
                                        *shares]) + " |")
    lines += ["", "## Verdicts", ""]
    for band in BANDS:
        verdict = judge_band(band, standings)
        lines += [f"- **Healthy runs sit at {band.text()}**: {verdict.verdict}: {verdict.reason}."]
        lines += [f"  - {number}" for number in verdict.numbers]
    return "\n".join(lines) + "\n"


def write_markdown(results: str = RESULTS, out: str | None = None) -> str:
    """Write the table to `out` (default: results/monitoring_bands.md); returns its path."""
    path = out or os.path.join(results, OUT_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(markdown(load_standings(results)))
    return path


def main(argv: list[str]) -> int:
    if len(argv) > 2 or (len(argv) == 2 and not os.path.isdir(argv[1])):
        print("usage: python -m scale_ablation.analysis.monitoring_bands [RESULTS_DIR] "
              "(a folder of studies with summary.csv)", file=sys.stderr)
        return 2
    print(write_markdown(argv[1] if len(argv) == 2 else RESULTS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
