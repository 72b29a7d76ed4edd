"""The coordinate check along depth (`coord_check --axis=num_layers`): its arms (`sp@0.5`), its
configs, a bad arm refused in one line, and the published check's README tables are its
verdicts.json (experiments/results/completep_coord_check_cpu)."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import QUICK, REPO

from scale_ablation.errors import ConfigError
from scale_ablation.training import coordinates
from scale_ablation.training import experiment_files as experiment

PUBLISHED = pathlib.Path(__file__).parent.parent / "experiments" / "results" / \
    "completep_coord_check_cpu"
ARMS = ("sp", "mup@0.5", "mup@1")


@pytest.mark.parametrize("arm, parts", [
    ("sp", ("sp", None, None)), ("sp@0.5", ("sp", None, 0.5)),
    ("mup@1:inv_dk", ("mup", "inv_dk", 1.0)), ("mup:mup_inv_dk:16", ("mup", "mup_inv_dk:16", None)),
])
def test_an_arm_is_parametrisation_alpha_and_policy(arm, parts):
    assert coordinates.split_arm(arm) == parts


def test_a_bad_alpha_in_an_arm_is_a_config_error():
    with pytest.raises(ConfigError, match="depth_alpha"):
        coordinates.split_arm("sp@half")


def test_a_depth_sets_layers_base_and_alpha():
    """Depth 8 from base 2 under `mup@1`: L, L_base and α set, μP's base width the model's own
    (its multipliers 1), the config's policy kept when told; the base's d_k otherwise."""
    config = experiment.load_config(QUICK)
    found = coordinates.axis_config(config, "num_layers", 8, "mup@1", 2, mup_attention=False)
    m = found.model
    assert (m.num_layers, m.base_num_layers, m.depth_alpha) == (8, 2, 1.0)
    assert (m.parametrization, m.base_d_model, found.policy) == ("mup", m.d_model, config.policy)
    mup = coordinates.axis_config(config, "num_layers", 8, "mup@1", 2)
    assert mup.policy == f"mup_inv_dk:{m.head_dim}"
    plain = coordinates.axis_config(config, "num_layers", 4, "sp", 2)
    assert (plain.model.num_layers, plain.model.depth_alpha) == (4, 0.0)


def test_a_bad_arm_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "scale_ablation.coord_check",
                             f"--config={QUICK}", "--axis=num_layers", "--widths=1,2",
                             "--parametrizations=sp,sp@0.3", f"--out={out}",
                             "--config.wandb.mode=disabled"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "model.depth_alpha" in lines[0], result.stderr
    assert not out.exists()


def test_the_tables_are_the_published_verdicts():
    verdicts = json.loads((PUBLISHED / "verdicts.json").read_text())
    assert (verdicts["axis"], list(verdicts["slopes"])) == ("num_layers", list(ARMS))
    assert verdicts["depth_alpha"] == {"sp": 0.0, "mup@0.5": 0.5, "mup@1": 1.0}
    cell = r" (\S+) \((\w+)\) \|"
    rows = re.findall(r"^\| `(\w+)` \|" + cell * 3 + "$", (PUBLISHED / "README.md").read_text(),
                      re.MULTILINE)
    assert {name for name, *_ in rows} == set(verdicts["slopes"]["sp"]) and len(rows) == 6
    for name, *cells in rows:
        for arm, slope, verdict in zip(ARMS, cells[::2], cells[1::2], strict=True):
            found = verdicts["slopes"][arm][name]
            assert float(slope) == round(found["slope"], 2) + 0.0, (arm, name)
            assert verdict == found["verdict"], (arm, name)


def test_sps_residual_grows_with_depth_and_completeps_does_not():
    """The published shape (Dey et al. 2025, Fig. 7): SP's stream grows with depth, under both
    α it is flat; α = 1/2's blocks learn less the deeper the model (its attention and MLP
    outputs shrink with depth), α = 1's do not."""
    slopes = json.loads((PUBLISHED / "verdicts.json").read_text())["slopes"]
    assert slopes["sp"]["residual"]["verdict"] == "grows"
    for arm in ("mup@0.5", "mup@1"):
        assert slopes[arm]["residual"]["verdict"] == "flat", arm
    assert {slopes["mup@0.5"][q]["verdict"] for q in ("attn_output", "mlp_output")} == {"shrinks"}
    assert {v["verdict"] for v in slopes["mup@1"].values()} == {"flat"}
