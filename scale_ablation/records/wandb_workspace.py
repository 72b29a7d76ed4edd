"""A W&B workspace (a saved view) for one study, built with the `wandb-workspaces` library
(optional extra `workspace`): the sweep's runs (its W&B group) grouped by policy, with the
panels a reviewer wants first: validation bits per byte over steps, final bits per byte against
d_k and against the LR, max |attention logit| over steps, and the report's tables and images
(the summary run's `summary` table and `plots/*` images, summary.md as markdown).

Online, `write` saves the view to W&B and returns its URL; in every mode it writes the view's
specification (the JSON W&B stores: `Workspace._to_model()`) to report/wandb_workspace.json,
so that an offline study has it and tests can read its panels and grouping without a server.
The library builds the specification offline; only `save()` talks to the server.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

SPEC_FILE = "wandb_workspace.json"


@dataclasses.dataclass(frozen=True)
class StudyView:
    """What the view shows: where the runs are and which keys they logged."""

    entity: str
    project: str
    group: str  # the sweep's W&B group: its runs and the report's summary run
    name: str
    history_metric: str = "val/bpb"  # MQAR: val/accuracy
    final_metric: str = "final_val_bpb"  # a summary field of each run
    layers: tuple[int, ...] = ()
    images: tuple[str, ...] = ()  # the summary run's image keys, plots/<stem>
    markdown: str = ""  # summary.md


def build(view: StudyView) -> Any:
    """The view as a `wandb_workspaces.workspaces.Workspace` (nothing is sent)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    final = view.final_metric.removeprefix("final_").replace("_", " ")
    sections = [
        ws.Section(name="Validation over training", is_open=True, panels=[
            wr.LinePlot(title=f"{view.history_metric} over steps (mean ± stderr per policy)",
                        x="Step", y=[view.history_metric], groupby_aggfunc="mean",
                        groupby_rangefunc="stderr")]),
        ws.Section(name="Final value against d_k and learning rate", is_open=True, panels=[
            wr.ScatterPlot(title=f"final {final} against d_k", x=wr.Config("model.head_dim"),
                           y=wr.SummaryMetric(view.final_metric), log_x=True),
            wr.ScatterPlot(title=f"final {final} against learning rate",
                           x=wr.Config("train.lr"), y=wr.SummaryMetric(view.final_metric),
                           log_x=True)]),
        ws.Section(name="Max attention logit over training", is_open=True, panels=[
            wr.LinePlot(title=f"max |attention logit|, layer {layer}", x="Step",
                        y=[f"attn/layer{layer}/max_abs_logit"], log_y=True,
                        groupby_aggfunc="mean", groupby_rangefunc="minmax")
            for layer in view.layers]),
        ws.Section(name="Report", is_open=True, panels=[
            wr.WeavePanelSummaryTable(table_name="summary"),
            *([wr.MediaBrowser(title="report plots", media_keys=list(view.images))]
              if view.images else []),
            *([wr.MarkdownPanel(markdown=view.markdown)] if view.markdown else [])]),
    ]
    return ws.Workspace(
        entity=view.entity, project=view.project, name=view.name, sections=sections,
        runset_settings=ws.RunsetSettings(
            filters=ws.And(ws.Metric("Group") == view.group), groupby=[ws.Config("policy")]))


def specification(workspace: Any) -> dict:
    """The JSON W&B stores for the view (the library's own serialisation)."""
    return workspace._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")


def write(view: StudyView, out_dir: str, online: bool) -> str:
    """Write out_dir/wandb_workspace.json and, `online`, save the view to W&B. Returns one
    line saying where the view is. An online save that fails leaves the specification."""
    workspace = build(view)
    path = os.path.join(out_dir, SPEC_FILE)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(specification(workspace), f, indent=1, sort_keys=True)
    if not online:
        return (f"W&B workspace specification written to {path} (offline; "
                "`report --wandb_workspace` saves it once logged in)")
    try:
        saved = workspace.save()
    except Exception as error:  # the view is a convenience: the report is complete without it
        return f"W&B workspace not saved ({type(error).__name__}: {error}); its spec: {path}"
    return f"W&B workspace saved: {saved.url} (spec: {path})"
