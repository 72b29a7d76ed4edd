"""The depth-transfer study (experiments/completep_transfer.py): its claims judge each α's runs
alone on rows whose optima are known, and its quick variant runs end to end (every run completes;
at the base depth CompleteP and μP are SP to the bit, one layer deeper they are not; every claim
gets a verdict over the located optima at both depths)."""

import math
import subprocess
import sys

import pytest
from helpers import REPO

from experiments import completep_transfer as study
from scale_ablation.analysis import transfer, verdicts


def synthetic_rows(best_lr_of, depths=(2, 4, 8), seeds=(0, 1, 2)) -> list[dict]:
    """Per arm and scale, losses (log2 lr − log2 best)² + 1 on a ×2 grid with a known best LR
    per depth: `best_lr_of(parametrisation, α, depth)`."""
    rows = []
    for parametrization, alpha in study.ARMS:
        for scale in study.SCALES:
            for depth in depths:
                best = best_lr_of(parametrization, alpha, depth)
                for k in range(7):
                    lr = 1e-3 * 2**k
                    for seed in seeds:
                        loss = (math.log2(lr) - math.log2(best)) ** 2 + 1 + 0.01 * seed
                        rows.append({
                            "policy": scale, "lr": lr, "seed": seed, "d_k": 16,
                            "status": "completed", "final_val_bpb": loss,
                            "override:model.parametrization": parametrization,
                            "override:model.depth_alpha": alpha,
                            "override:model.num_layers": depth, "override:train.lr": lr})
    return rows


def test_each_claim_judges_its_own_alphas_runs():
    """SP's best LR halves per doubling of depth; α = 1/2 keeps it at 8e-3 at every depth and
    α = 1 drifts ×4 over depth. The two CompleteP arms share the key (μP, policy) that
    `transfer.optima` groups by: only a claim over one α's runs can tell them apart."""
    def best(parametrization, alpha, depth):
        if alpha == 0.0:
            return 1.6e-2 * 2 / depth
        return 8e-3 if alpha == 0.5 else 8e-3 * 2 / depth

    rows = synthetic_rows(best)
    found = {claim.text: verdicts.judge(claim, rows) for claim in study.claims("cpu")}
    assert len(found) == 6
    for text, verdict in found.items():
        expected = "contradicted" if "(α = 1)" in text else "supported"
        assert verdict.verdict == expected, (text, verdict)
        assert "best LR by depth 2:" in verdict.numbers[0], verdict.numbers
    pooled = transfer.optima(rows, study.AXIS)  # every depth, seed and LR of both α, one key
    assert set(pooled) == {(p, s) for p in ("sp", "mup") for s in study.SCALES}


def test_the_cpu_grid_is_every_arm_scale_depth_lr_and_seed():
    points = study.sweep("cpu")
    cells = {(p["model.parametrization"], p["model.depth_alpha"], p["policy"],
              p["model.num_layers"]) for p in points}
    assert len(cells) == 3 * 2 * 3 and {c[3] for c in cells} == {2, 4, 8}
    assert len(points) == len(cells) * 4 * 3  # ×2 LR grid of 4, 3 seeds
    assert {p["model.depth_alpha"] for p in points} == {0.0, 0.5, 1.0}
    assert {p["policy"] for p in points} == {"inv_sqrt_dk", "inv_dk"}
    config = study.get_config("cpu")
    assert (config.model.base_num_layers, config.model.num_layers) == (2, 2)


@pytest.mark.slow  # ~1.5 min on 2 cores: 24 runs in 6 compiled groups
def test_quick_sweep_runs_end_to_end(tmp_path):
    result = subprocess.run([sys.executable, "-m", "scale_ablation.sweep",
                             f"--config={REPO}/experiments/completep_transfer.py:quick",
                             f"--workdir={tmp_path}", "--report=false"], capture_output=True,
                            text=True, cwd=REPO, timeout=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    from scale_ablation import report
    rows = [report.summarise_run(run) for run in report.load_runs(str(tmp_path))]
    assert len(rows) == len(study.sweep("quick")) == 24
    assert all(r["status"] == "completed" for r in rows)
    loss = {(r["override:model.depth_alpha"], r["policy"], r["override:model.num_layers"],
             r["lr"]): r["final_val_bpb"] for r in rows}
    for (alpha, scale, depth, lr), value in loss.items():
        sp = loss[(0.0, scale, depth, lr)]
        if depth == 1:  # the base depth: every multiplier 1, μP at its base width is SP
            assert value == sp, (alpha, scale, lr)
        elif alpha:
            assert value != sp, (alpha, scale, lr)
    for claim in study.claims("quick"):
        verdict = verdicts.judge(claim, rows)
        assert verdict.verdict in ("supported", "contradicted", "inconclusive"), verdict
        assert "best LR by depth 1:" in verdict.numbers[0] and ", 2:" in verdict.numbers[0]
