"""`report --wandb_workspace` offline: the view's specification beside the report, its runs
grouped by policy within the sweep's W&B group and its panels on the keys the runs log; and the
report's summary run keeping one offline folder however often the report is written."""

from __future__ import annotations

import json
import time

import pytest
from helpers import require, tiny_config

from scale_ablation import report
from scale_ablation.records import wandb_workspace
from scale_ablation.records.wandb_tracker import WandbSettings, WandbTracker

require("wandb_workspaces")


def panels(spec: dict) -> dict[str, list[dict]]:
    """Section name -> its panels, from W&B's stored view (spec.section.panelBankConfig)."""
    return {section["name"]: section["panels"]
            for section in spec["spec"]["section"]["panelBankConfig"]["sections"]}


@pytest.fixture
def spec(tmp_path) -> dict:
    out = tmp_path / "sweep" / "report"
    out.mkdir(parents=True)
    (out / "summary.md").write_text("# Final validation bits per byte\n\n| a |\n")
    for name in ("final_bpb_vs_dk.png", "val_loss_curves.png"):
        (out / name).write_bytes(b"\x89PNG")
    config = tiny_config().to_dict()
    config["wandb"].update(mode="offline", project="proj", group="")
    rows = [{"policy": p, "d_k": 16, "task": "lm", "max_attention_logit/layer0": 3.0,
             "max_attention_logit/layer1": 4.0} for p in ("inv_sqrt_dk", "none")]
    line = report.write_workspace(str(tmp_path / "sweep"), [{"config": config}], rows)
    assert "offline" in line and str(out / wandb_workspace.SPEC_FILE) in line
    return json.loads((out / wandb_workspace.SPEC_FILE).read_text())


def test_runs_of_the_sweep_grouped_by_policy(spec):
    (runset,) = spec["spec"]["section"]["runSets"]
    assert runset["grouping"] == [{"section": "config", "name": "policy.value"}]
    (only,) = runset["filters"]["filters"]
    assert (only["key"], only["op"], only["value"]) == (
        {"section": "run", "name": "group"}, "=", "sweep")  # the sweep's group: its dir name
    assert spec["project"] == "proj"


def test_panels_on_the_keys_the_runs_log(spec):
    found = panels(spec)
    (validation,) = found["Validation over training"]
    assert validation["viewType"] == "Run History Line Plot"
    assert validation["config"]["metrics"] == ["val/bpb"]
    assert validation["config"]["groupAgg"] == "mean"
    against = {p["config"]["xAxis"]: p["config"] for p in
               found["Final value against d_k and learning rate"]}
    assert set(against) == {"config:model.value.head_dim", "config:train.value.lr"}
    assert all(c["yAxis"] == "summary:final_val_bpb" and c["xAxisLogScale"]
               for c in against.values())
    logits = found["Max attention logit over training"]
    assert [p["config"]["metrics"] for p in logits] == [["attn/layer0/max_abs_logit"],
                                                        ["attn/layer1/max_abs_logit"]]
    assert all(p["config"]["yLogScale"] for p in logits)
    kinds = {p["viewType"]: p["config"] for p in found["Report"]}
    assert kinds["Media Browser"]["mediaKeys"] == ["plots/final_bpb_vs_dk",
                                                  "plots/val_loss_curves"]
    assert kinds["Markdown Panel"]["value"].startswith("# Final validation bits per byte")
    assert "summary" in json.dumps(kinds["Weave"])  # runs.summary["summary"]: the table


@pytest.mark.parametrize("one_folder,folders", [(True, 1), (False, 2)])
def test_summary_run_keeps_one_offline_folder(tmp_path, one_folder, folders):
    """Two reports in one sweep: one offline folder with the flag, one per report without."""
    settings = WandbSettings(mode="offline", project="p", job_type="report")
    ids = set()
    for attempt in range(2):
        time.sleep(1.1 * attempt)  # wandb names a folder by the second it starts
        tracker = WandbTracker(tmp_path, {"sweep_dir": str(tmp_path)}, settings,
                               one_offline_folder=one_folder)
        tracker.log(0, {"x": 1.0})
        tracker.finish()
        ids.add(tracker.run_id)
    found = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(ids) == 1 and len(found) == folders
    assert found[-1].name.endswith(ids.pop())
