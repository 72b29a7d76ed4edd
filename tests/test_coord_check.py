"""The coordinate check on a tiny model: its own output's slopes grow with width under SP and
stay flat under μP (mup's get_coord_data; Yang et al. 2022, Fig. 5), and along the head dim the
attention output grows under SP and not under head-dim μP; bad input is one line."""

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import QUICK, REPO

TINY = ["--config.model.num_layers=1", "--config.model.num_heads=2", "--config.model.d_model=32",
        "--config.model.head_dim=16", "--config.data.seq_len=32", "--config.train.batch_size=4",
        "--config.train.lr=0.01", "--config.wandb.mode=disabled"]


def coord_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scale_ablation.coord_check", f"--config={QUICK}",
                           *args], capture_output=True, text=True, cwd=REPO, timeout=900)


@pytest.mark.parametrize("flag, says", [("--widths=32,abc", "--widths"),
                                        ("--parametrizations=sp,xp", "--parametrizations"),
                                        ("--widths=32,33", "whole head dims"),
                                        ("--parametrizations=sp,xp:inv_dk", "--parametrizations"),
                                        ("--axis=depth", "--axis"),
                                        ("--parametrizations=mup:nope", "nope"),
                                        ("--config.model.nope=1", "nope")])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, flag, says):
    out = tmp_path / "out"
    result = coord_check(flag, f"--out={out}", *TINY)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert not out.exists()


def slope(widths, values) -> float:
    return float(np.polyfit(np.log(widths), np.log(values), 1)[0])


@pytest.mark.slow  # minutes on 2 cores: `-m slow`
def test_grows_under_sp_and_stays_flat_under_mup(tmp_path):
    result = coord_check("--widths=32,64,128", "--steps=6", "--seeds=1", f"--out={tmp_path}",
                         *TINY)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "coord_check.json").read_text())
    assert sorted(data) == ["mup", "sp"] and sorted(data["sp"], key=int) == ["32", "64", "128"]
    widths = [32, 64, 128]
    last = {name: {q: [data[name][str(w)][q][-1] for w in widths] for q in data[name]["32"]}
            for name in data}
    assert all(len(v) == 6 for v in data["mup"]["64"].values())
    for quantity in ("attn_output", "mlp_output", "residual"):
        assert slope(widths, last["sp"][quantity]) > 0.5, quantity  # ~width¹ under SP's Adam
    for quantity in ("embedding", "attn_output", "mlp_output", "residual", "output_logits"):
        assert abs(slope(widths, last["mup"][quantity])) < 0.25, quantity
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts["slopes"]["mup"]["residual"]["verdict"] == "flat"
    assert {p.name for p in tmp_path.glob("*.png")} == {f"{q}.png" for q in last["sp"]}


@pytest.mark.slow  # minutes on 2 cores: `-m slow`
def test_along_the_head_dim_the_attention_output_grows_under_sp_only(tmp_path):
    """d_model 32, 2 heads, head dims 16…256: SP's output projection takes Adam's full step on a
    fan-in that grows, so its output grows; μP's output weight (× 16/d_v) does not, whichever
    scale the logits take."""
    arms = "sp:inv_sqrt_dk,mup,mup:inv_sqrt_dk"
    result = coord_check("--axis=head_dim", "--widths=16,64,256", "--steps=6", "--seeds=1",
                         f"--parametrizations={arms}", f"--out={tmp_path}", *TINY)
    assert result.returncode == 0, result.stderr
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert (verdicts["axis"], verdicts["base"]) == ("head_dim", 16)
    assert verdicts["policy"] == {"sp:inv_sqrt_dk": "inv_sqrt_dk", "mup": "mup_inv_dk:16",
                                  "mup:inv_sqrt_dk": "inv_sqrt_dk"}
    slopes = {arm: {q: v["slope"] for q, v in by_q.items()}
              for arm, by_q in verdicts["slopes"].items()}
    assert slopes["sp:inv_sqrt_dk"]["attn_output"] > 0.5
    for arm in ("mup", "mup:inv_sqrt_dk"):
        assert slopes[arm]["attn_output"] < 0.1, arm
    # 1/√d_k lets the logits grow once q and k align; μP's 1/d_k does not.
    assert slopes["mup:inv_sqrt_dk"]["attn_logits"] > slopes["mup"]["attn_logits"] + 0.3
