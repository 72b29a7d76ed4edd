"""The width-transfer figures (`analysis.transfer_plots`) on summary rows shaped like
experiments/mup_transfer.py:cpu's grid (2 parametrisations × 3 policies × widths × LRs × 2
seeds), whose losses are parabolas in log2(lr) with a known vertex per (parametrisation, policy,
width). Checked: the report draws both figures for a width sweep and neither for a sweep without
a width axis; every series is drawn; the located best LR drawn is the closed-form vertex; the
curves are means over seeds (numpy); one colour per policy across the report; baselines drawn
or named; n said; image sizes under the cap; one legend, clear of every panel."""

from __future__ import annotations

import itertools
import math
import struct

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb

from experiments import mup_transfer
from scale_ablation.analysis import plot_style, transfer, transfer_plots
from scale_ablation.analysis import plots as report_plots

UNIGRAM, BIGRAM = 4.9, 3.3
# Each seed's vertex is 2^shift off the setting's; the shifts of seeds 0-1 and of 0-4 (the
# claimed settings' extra seeds) each average 0, so the mean's vertex is exact.
SEED_SHIFTS = (-0.1, 0.1, -0.1, 0.1, 0.0)
NAMES = ("best_lr_vs_width.png", "loss_vs_lr_by_width.png")


def best_lr(parametrization: str, policy: str, width: int) -> float:
    """The vertex of the loss curve: SP with 1/√d_k moves ×½ per doubling; the others stay
    at 6e-3, between grid points."""
    if (parametrization, policy) == ("sp", "inv_sqrt_dk"):
        return 8e-3 * 64 / width
    return 6e-3


def diverges(parametrization: str, policy: str, lr: float) -> bool:
    return parametrization == "sp" and policy.startswith("mup_inv_dk") and lr > 0.03


def loss(parametrization: str, policy: str, width: int, lr: float, seed: int,
         best=best_lr) -> float:
    centre = math.log2(best(parametrization, policy, width)) + SEED_SHIFTS[seed]
    return 3.6 - 0.1 * math.log2(width / 64) + 0.05 * (math.log2(lr) - centre) ** 2


def rows(best=best_lr) -> list[dict]:
    out = []
    for point in mup_transfer.sweep("cpu"):
        p, policy = point["model.parametrization"], point["policy"]
        width, lr, seed = point["model.d_model"], point["train.lr"], point["train.seed"]
        failed = diverges(p, policy, lr)
        out.append({
            "name": ",".join(f"{k}={v}" for k, v in point.items()), "policy": policy,
            "d_k": point["model.head_dim"], "lr": lr, "seed": seed, "task": "lm",
            **{f"override:{k}": v for k, v in point.items()},
            "status": "diverged" if failed else "completed",
            "final_val_bpb": None if failed else loss(p, policy, width, lr, seed, best),
            "baseline_unigram_bpb": UNIGRAM, "baseline_bigram_bpb": BIGRAM})
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("transfer_plots")
    found = rows()
    style = plot_style.Style.of(found)
    figures = report_plots.row_plots(found, style)
    for name, fig in figures.items():
        plot_style.save(fig, str(out / name))
        FigureCanvasAgg(fig).draw()  # for the bounding boxes below
    return out, found, style, figures


def series(fig) -> dict[str, list]:
    """gid -> [(axes, line)] of the figure's named series."""
    out: dict = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_gid():
                out.setdefault(line.get_gid(), []).append((ax, line))
    return out


def settings() -> set[tuple[str, str]]:
    return {(p["model.parametrization"], p["policy"]) for p in mup_transfer.sweep("cpu")}


def test_the_report_draws_both_for_a_width_sweep_and_neither_without_one(rendered):
    _, found, style, figures = rendered
    assert set(NAMES) <= set(figures)
    no_width = [{k: v for k, v in r.items() if k not in transfer_plots.LABELS} for r in found]
    one_width = [r for r in found if r[transfer.WIDTH] == 64]
    one_lr = [r for r in found if r["lr"] == found[0]["lr"]]
    for other in (no_width, one_width, one_lr):
        assert transfer_plots.figures(other, style) == {}


@pytest.mark.parametrize("axis, name", [("override:model.head_dim", "head_dim"),
                                        ("override:model.qk_dim", "qk_dim")])
def test_a_head_dim_sweep_draws_its_own_axis_and_a_study_without_parametrisations_none(
        rendered, axis, name):
    """The same rows keyed by a head dim (issue 55: transfer along d_k) draw the two figures
    under that axis's names, labelled by it, with the same located optima; without the
    parametrisation column (dk_sweep, dk_exponent vary head dims too) nothing is drawn."""
    _, found, style, figures = rendered
    keyed = [{**{k: v for k, v in r.items() if k not in transfer_plots.LABELS},
              axis: r[transfer.WIDTH] // 4} for r in found]
    drawn = transfer_plots.figures(keyed, style)
    assert set(drawn) == {f"best_lr_vs_{name}.png", f"loss_vs_lr_by_{name}.png"}
    labels = {ax.get_xlabel() for ax in drawn[f"best_lr_vs_{name}.png"].axes}
    assert transfer_plots.LABELS[axis][0] in labels
    assert series(drawn[f"best_lr_vs_{name}.png"]).keys() == series(
        figures["best_lr_vs_width.png"]).keys()
    bare = [{k: v for k, v in r.items() if k != transfer.PARAMETRIZATION} for r in keyed]
    assert transfer_plots.figures(bare, style) == {}


def test_depth_alpha_arms_get_panels_of_their_own(rendered):
    """μP rows split into two CompleteP arms by `model.depth_alpha` (0.5, 1): each arm is a
    parametrisation of its own in the figure, not one line through both."""
    _, found, style, _ = rendered
    split = [{**r, transfer_plots.DEPTH_ALPHA: 0.5 if r["seed"] == 0 else 1.0}
             if r[transfer.PARAMETRIZATION] == "mup" else r for r in found]
    drawn = transfer_plots.figures(split, style)["best_lr_vs_width.png"]
    params = {gid.split("|")[0] for gid in series(drawn)}
    assert params == {"sp", "mup α=0.5", "mup α=1"}


def test_settings_that_do_not_fill_the_grid_sit_side_by_side(rendered):
    """Each policy under one parametrisation only (umup_transfer's three settings): one row of
    panels, one per setting, none hidden, rather than a parametrisation × policy grid of
    holes whose visible panels lose the shared y scale's labels."""
    _, found, style, _ = rendered
    sparse = [r for r in found if (r[transfer.PARAMETRIZATION] == "sp")
              == (r["policy"] == "inv_sqrt_dk")]
    pairs = {(r[transfer.PARAMETRIZATION], r["policy"]) for r in sparse}
    assert len(pairs) < len({p for p, _ in pairs}) * len({q for _, q in pairs})  # holes
    fig = transfer_plots.figures(sparse, style)["loss_vs_lr_by_width.png"]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(fig.axes) == len(pairs)
    assert len({round(ax.get_position().y0, 3) for ax in panels}) == 1
    assert panels[0].get_yticklabels() and any(t.get_text() for t in panels[0].get_yticklabels())


def test_every_series_drawn(rendered):
    *_, figures = rendered
    widths = {p["model.d_model"] for p in mup_transfer.sweep("cpu")}
    assert set(series(figures["best_lr_vs_width.png"])) == {f"{p}|{q}" for p, q in settings()}
    by_width = series(figures["loss_vs_lr_by_width.png"])
    assert set(by_width) == {f"{p}|{q}|{w}" for p, q in settings() for w in widths}
    for gid, lines in by_width.items():  # one panel per (parametrisation, policy)
        (ax, _), = lines
        p, policy, _ = gid.split("|")
        assert ax.get_title() == f"{transfer_plots.NAMES[p]}, {policy}"


def test_the_drawn_best_lr_is_the_known_vertex(rendered):
    """Interior widths: the parabola's vertex, exactly; the edge width: the grid's lowest LR."""
    *_, figures = rendered
    lrs = sorted({p["train.lr"] for p in mup_transfer.sweep("cpu")})
    for gid, ((_, line),) in series(figures["best_lr_vs_width.png"]).items():
        p, policy = gid.split("|")
        widths = sorted({w["model.d_model"] for w in mup_transfer.sweep("cpu")})
        dodge = np.asarray(line.get_xdata()) / widths  # a sideways offset of a few percent
        assert np.all(np.abs(np.log2(dodge)) <= 0.1) and np.ptp(dodge) < 1e-12, gid
        expected = [max(best_lr(p, policy, w), lrs[0]) for w in widths]
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-9, err_msg=gid)


def test_the_curves_are_means_over_seeds(rendered):
    _, found, _, figures = rendered
    for gid, ((_, line),) in series(figures["loss_vs_lr_by_width.png"]).items():
        p, policy, width = gid.split("|")
        lrs = sorted({r["lr"] for r in found if r["override:model.d_model"] == int(width)
                      and not diverges(p, policy, r["lr"])})  # each width's own grid
        seeds = {r["seed"] for r in found if r["policy"] == policy
                 and r["override:model.parametrization"] == p}
        expected = [np.mean([loss(p, policy, int(width), lr, s) for s in seeds]) for lr in lrs]
        np.testing.assert_allclose(line.get_xdata(), lrs, err_msg=gid)
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12, err_msg=gid)


def test_one_colour_per_policy_across_the_report(rendered):
    """A policy's best-LR line and its widest curve are its colour in the LR plot every report
    draws; narrower widths are lighter shades of it."""
    _, _, style, figures = rendered
    for gid, ((_, line),) in series(figures["best_lr_vs_width.png"]).items():
        assert line.get_color() == style.colours[gid.split("|")[1]], gid
    for gid, lines in series(figures["loss_vs_lr.png"]).items():
        assert {line.get_color() for _, line in lines} == {style.colours[gid.split("|")[0]]}
    curves = series(figures["loss_vs_lr_by_width.png"])
    widths = sorted({point["model.d_model"] for point in mup_transfer.sweep("cpu")})
    for p, policy in settings():
        colour = np.array(to_rgb(style.colours[policy]))
        shades = [np.array(curves[f"{p}|{policy}|{w}"][0][1].get_color())
                  for w in (widths[0], widths[-1])]
        np.testing.assert_allclose(shades[1], colour)
        assert np.all(shades[0] >= colour - 1e-12) and np.any(shades[0] > colour + 0.1)


def test_baselines_drawn_or_named_and_n_said(rendered):
    *_, figures = rendered
    for ax in figures["loss_vs_lr_by_width.png"].axes:
        if not ax.get_visible():
            continue
        low, high = ax.get_ylim()
        lines = {round(line.get_ydata()[0], 6) for line in ax.get_lines()
                 if line.get_color() == plot_style.GREY}
        texts = " ".join(t.get_text() for t in ax.texts)
        for value, label in ((UNIGRAM, "unigram"), (BIGRAM, "bigram")):
            assert (value in lines) if low <= value <= high else f"{label} {value:.3g}" in texts
    for name in NAMES:
        assert "n = 2" in figures[name].legends[0].get_title().get_text(), name


def test_sizes_under_the_cap_and_one_legend_clear_of_every_panel(rendered):
    out, _, _, figures = rendered
    for name in NAMES:
        header = (out / name).read_bytes()[:24]
        width, height = struct.unpack(">II", header[16:24])  # PNG IHDR
        assert header[:4] == b"\x89PNG" and 300 <= width <= 2400 and 200 <= height <= 2400
        fig = figures[name]
        renderer = fig.canvas.get_renderer()
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 + 1, name
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1 + 1, name
        for ax in fig.axes:
            if ax.get_visible():
                assert not box.overlaps(ax.get_window_extent(renderer)), (name, ax.get_title())


def close_ends(parametrization: str, policy: str, width: int) -> float:
    """Every line ends near 3e-3, a few percent apart, the first policy the sweep lists lowest:
    the reverse of a stacking by the order lines are drawn in."""
    order = list(dict.fromkeys(p["policy"] for p in mup_transfer.sweep("cpu")))
    return 6e-3 if width == 64 else 3e-3 * 1.04 ** order.index(policy)


@pytest.mark.parametrize("best", [best_lr, close_ends], ids=["known", "close_ends"])
def test_ratio_labels_name_each_line_in_its_end_order_and_stay_apart(best):
    """In each panel one ×r label per line, stacked in the order the lines end from the bottom
    up, no two overlapping, where lines end at the same LR or close in the other order."""
    found = rows(best)
    fig = transfer_plots.plot_best_lr(found, plot_style.Style.of(found))
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    optima = transfer.optima(found)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        param = {v: k for k, v in transfer_plots.NAMES.items()}[ax.get_title()]
        mine = [w for (p, _), w in optima.items() if p == param]
        ends = sorted(mine, key=lambda w: w[max(w)].lr_star)  # ties: any order is right
        labels = sorted((t for t in ax.texts if t.get_text().startswith("×")),
                        key=lambda t: t.get_window_extent(renderer).y0)
        assert [t.get_text() for t in labels] == [f"×{transfer.spread(w)[0]:.2g}" for w in ends]
        boxes = [t.get_window_extent(renderer) for t in labels]
        for below, above in itertools.pairwise(boxes):
            assert below.y1 <= above.y0 + 0.5, param
