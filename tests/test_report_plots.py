"""The report's plots at the shipped sweeps' sizes, from synthetic run files (tests/synthetic_sweep):
the largest grid (dk_sweep's policies × its 2 inits × 8 cells of both arms × 3 seeds, written out
here so that a change to the accelerator grid does not change the test), dk_sweep's cpu grid (an
LR grid, two arms sharing a cell) and its quick grid (one seed). Checked: image sizes, one legend per figure clear of
every panel, every series drawn and no panel crowded, one colour per policy across plots, the
drawn values against numpy, baselines drawn or named, intervals only where n >= 2."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import synthetic_sweep as syn
from matplotlib.backends.backend_agg import FigureCanvasAgg

from experiments import dk_sweep
from scale_ablation import report
from scale_ablation.analysis import plot_groups, plot_style
from scale_ablation.analysis import plots as report_plots

STEPS = tuple(range(0, 601, 100))
D_MODEL, FIXED_HEADS = 512, 4
CELLS = [(D_MODEL // d, d) for d in (16, 64, 256, 512)] + [(FIXED_HEADS, d) for d in (16, 64, 256, 1024)]


def grid(arg: str | None) -> tuple[dict, list[dict]]:
    """(config dict, points): `None` is the largest grid, else dk_sweep's own."""
    if arg is not None:
        return dk_sweep.get_config(arg).to_dict(), dk_sweep.sweep(arg)
    config = dk_sweep.get_config("quick").to_dict()
    config["model"]["d_model"] = D_MODEL
    return config, [{"policy": policy, "model.num_heads": heads, "model.head_dim": d_k,
                     "model.init": init, "train.seed": seed}
                    for init in dk_sweep.INITS for policy in dk_sweep.POLICIES
                    for heads, d_k in CELLS for seed in (0, 1, 2)]
CURVES = ("val_loss_curves.png", "entropy_over_training.png", "max_logit_over_training.png")


def render(arg: str | None, out) -> tuple[list, list, dict]:
    with pytest.MonkeyPatch.context() as patch:  # the data is not read: fixed count baselines
        patch.setattr(report, "_baselines", lambda config: dict(syn.BASELINES))
        runs = syn.runs(*grid(arg), STEPS)
        rows = [report.summarise_run(run) for run in runs]
    figures = report_plots.build_plots(runs, rows)
    for name, fig in figures.items():
        plot_style.save(fig, str(out / name))
        FigureCanvasAgg(fig).draw()  # for the bounding boxes below
    return runs, rows, figures


@pytest.fixture(scope="module", params=[None, "cpu"], ids=["default", "cpu"])
def sweep(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"plots_{request.param}")
    return (request.param, out, *render(request.param, out))


def expected_series(arg: str | None) -> set[tuple[str, str, int]]:
    """(policy, second axis, d_k) of every cell of the grid, from the experiment's own cells:
    the fixed-width arm is num_heads × d_k = d_model, the fixed-heads arm FIXED_HEADS."""
    config, points = grid(arg)
    d_model = config["model"]["d_model"]
    fixed = FIXED_HEADS if arg is None else dk_sweep.FIXED_HEADS[arg]
    d_ks: dict = {}
    for point in points:
        d_ks.setdefault(point["model.num_heads"], set()).add(
            point.get("model.qk_dim") or point["model.head_dim"])
    out = set()
    for point in points:
        heads, value = point["model.num_heads"], point["model.head_dim"]
        d_k = point.get("model.qk_dim") or value  # the q/k-width arm: d_k apart from the value
        # A fixed-heads arm is a head count spanning several d_k (cpu: the q/k-width arm).
        fixed_heads = (heads == fixed or "model.qk_dim" in point) and len(d_ks[heads]) > 1
        arms = ([f"width {d_model}"] if heads * d_k == d_model else []) + (
            [f"{heads} head{'s' if heads > 1 else ''}"] if fixed_heads else [])
        init = f"init={point['model.init']}, " if "model.init" in point else ""
        out |= {(point["policy"], init + arm, d_k) for arm in arms}
    return out


def drawn(fig) -> dict[str, list]:
    """gid -> [(axes, line)] of every series line in the figure's visible panels."""
    out: dict = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if ax.get_visible() and line.get_gid():
                out.setdefault(line.get_gid(), []).append((ax, line))
    return out


def test_images_within_the_size_cap(sweep):
    arg, out, _, _, figures = sweep
    names = {*CURVES, "final_bpb_vs_dk.png", "learned_scale_over_training.png",
             "learned_scale_vs_dk.png"} if arg is None else {
        *CURVES, "final_bpb_vs_dk.png", "loss_vs_lr.png", "max_logit_vs_lr_layer0.png",
        "max_logit_vs_lr_layer1.png"}
    assert set(figures) == names
    for name in names:
        header = (out / name).read_bytes()[:24]
        width, height = struct.unpack(">II", header[16:24])  # PNG IHDR
        assert header[:4] == b"\x89PNG" and 300 <= width <= 2400 and 200 <= height <= 2400, name


def test_one_legend_per_figure_clear_of_every_panel(sweep):
    *_, figures = sweep
    for name, fig in figures.items():
        renderer = fig.canvas.get_renderer()
        assert not any(ax.get_legend() for ax in fig.axes), name
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 + 1, name  # not cut off
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1 + 1, name
        for ax in fig.axes:
            if ax.get_visible():
                assert not box.overlaps(ax.get_window_extent(renderer)), (name, ax.get_title())


def test_every_series_drawn_and_no_panel_crowded(sweep):
    arg, *_, figures = sweep
    cells = expected_series(arg)
    for name in CURVES:
        gids = set(drawn(figures[name]))
        if arg is None:  # small multiples: a cell two arms share is drawn in each arm's row
            assert gids == {f"{p}|{s}|{d}" for p, s, d in cells}, name
        else:  # one row: the shared cell (1 head × 128 = d_model) drawn once
            assert {(p, d) for p, _, d in (g.split("|") for g in gids)} == {
                (p, str(d)) for p, _, d in cells}, name
            # Each distinct model (policy, init, heads, value width, q/k width) drawn once.
            models = {(q["policy"], q.get("model.init"), q["model.num_heads"],
                       q["model.head_dim"], q.get("model.qk_dim")) for q in grid(arg)[1]}
            assert len(gids) == len(models), name
    final = set(drawn(figures["final_bpb_vs_dk.png"]))
    assert final == {f"{p}|{s}" for p, s, _ in cells}
    for fig in figures.values():
        for ax in fig.axes:
            assert len({line.get_gid() for line in ax.get_lines() if line.get_gid()}) <= 8


def test_one_colour_per_policy_in_every_plot(sweep):
    *_, figures = sweep
    colours: dict = {}
    for fig in figures.values():
        for gid, lines in drawn(fig).items():
            colours.setdefault(gid.split("|")[0], set()).update(
                line.get_color() for _, line in lines)
    assert all(len(found) == 1 for found in colours.values()), colours
    assert len({next(iter(found)) for found in colours.values()}) == len(colours)


def test_drawn_values_are_means_over_seeds(sweep):
    """Validation bpb: the mean over seeds; max logit: the geometric mean over seeds of the
    max over layers (layer 1's, by construction), computed here with numpy."""
    arg, _, _, _, figures = sweep
    if arg is not None:
        pytest.skip("the default grid carries the check")
    index = list(dk_sweep.POLICIES).index("inv_log_dk")
    second, d_k, seeds = "init=gpt2, 4 heads", 64, (0, 1, 2)
    gid = f"inv_log_dk|{second}|{d_k}"
    ((_, line),) = drawn(figures["val_loss_curves.png"])[gid]
    lr = grid(None)[0]["train"]["lr"]
    expected = [np.mean([syn.bpb(index, "gpt2", d_k, s, step, lr) for s in seeds])
                for step in STEPS]
    np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12)
    ((_, line),) = drawn(figures["max_logit_over_training.png"])[gid]
    expected = [np.exp(np.mean(np.log([syn.max_logit(index, 1, d_k, s, step) for s in seeds])))
                for step in STEPS]
    np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12)


def test_baselines_drawn_or_named_at_the_edge(sweep):
    *_, figures = sweep
    for name in ("val_loss_curves.png", "final_bpb_vs_dk.png"):
        for ax in figures[name].axes:
            if not ax.get_visible():
                continue
            low, high = ax.get_ylim()
            lines = {round(line.get_ydata()[0], 6) for line in ax.get_lines()
                     if line.get_color() == plot_style.GREY}
            texts = " ".join(t.get_text() for t in ax.texts)
            for value, label in ((syn.UNIGRAM_BPB, "unigram"), (syn.BIGRAM_BPB, "bigram")):
                inside = low <= value <= high
                assert (value in lines) if inside else (f"{label} {value:.3g}" in texts), (
                    name, ax.get_title(), label)


def test_intervals_only_where_n_at_least_2_and_n_said(tmp_path):
    """The quick grid has one seed: no bands, no error bars, and every legend says n = 1."""
    _, _, figures = render("quick", tmp_path)
    for name, fig in figures.items():
        if name != "learned_scale_vs_dk.png":  # a point per run, no mean: said in its legend
            assert "n = 1" in fig.legends[0].get_title().get_text(), name
        for ax in fig.axes:
            assert not ax.collections, (name, ax.get_title())  # fill_between, error bars


def test_arms_of_the_cpu_grid():
    """dk_sweep cpu's cells: 8 × 16 and 1 × 128 are the fixed width (d_model 128); its other
    arm varies the q/k width (model.qk_dim) and is not a cell of heads × head_dim."""
    rows = [{"d_k": d, "override:model.num_heads": h} for h, d in dk_sweep.cells("cpu")]
    arms = plot_groups.arms(rows)
    assert [arms(r) for r in rows] == [["width 128"], ["width 128"]]
    assert plot_groups.arms([{"d_k": 16}])({"d_k": 16}) == [""]


def test_a_series_without_the_swept_field_is_named_by_it():
    """lr_sensitivity's z-loss arm: the runs that leave train.z_loss unset are labelled by the
    field the other arm sets, not by a bare "(other)"."""
    rows = [{"policy": "inv_sqrt_dk", "d_k": 32, "override:train.z_loss": z} for z in ("", 1e-4)]
    keys = plot_style.Keys(plot_style.Style.of(rows))
    for row, second in zip(rows, ("", "z_loss=0.0001"), strict=True):
        assert plot_groups.second_axis(rows)(row) == [second]
        keys.series(row["policy"], second, 3)
    _, labels = keys.handles()
    assert labels == ["inv_sqrt_dk", "z_loss at default", "z_loss=0.0001"]


def test_learned_scale_plot_fits_the_runs_at_each_best_lr():
    """Runs at the best LR follow s = 2·d_k^(−3/4); those at a worse LR sit elsewhere: the
    drawn fit has slope −3/4 (the law, read off the line's ends) and the legend says it."""
    rows = []
    for d_k in (8, 32, 128):
        for lr, bpb, scale in ((1e-2, 2.7, 2 * d_k ** -0.75), (3e-2, 2.9, 1.0)):
            for seed in (0, 1):
                rows.append({"policy": "learned", "d_k": d_k, "lr": lr, "seed": seed,
                             "status": "completed", "final_val_bpb": bpb + 0.01 * seed,
                             "final_learned_scale": scale})
    fig = report_plots.plot_learned_scale(rows)
    (ax,) = fig.axes
    (fit,) = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    x, y = (np.log(values) for values in fit.get_data())
    assert (y[-1] - y[0]) / (x[-1] - x[0]) == pytest.approx(-0.75)
    assert "fit, learned: slope -0.75" in [t.get_text() for t in fig.legends[0].get_texts()]
    (filled,) = [line for line in ax.get_lines() if line.get_gid() == "learned"]
    assert sorted(filled.get_ydata()) == pytest.approx(sorted(2 * d ** -0.75 for d in (8, 32, 128)
                                                              for _ in (0, 1)))


def test_many_arms_at_one_d_k_wrap_into_titled_panels():
    """precision's shape: 2 policies × 7 recipes (long labels) at one d_k is more than a panel
    holds, so each recipe gets a panel, wrapped four to a row; its title names the recipe, so
    the legend does not, and no title runs into another panel, another title, the legend or
    the image edge (checked on the drawn bounding boxes: long unwrapped titles overlapped and
    the legend sat over the first panel)."""
    rows = [{"policy": policy, "d_k": 32, "lr": lr, "seed": seed, "status": "completed",
             "final_val_bpb": 3.0 + lr + seed / 100, "override:train.dtype": "float16",
             "override:train.logits_dtype": "activation",
             "override:train.residual_dtype": "float32", "override:train.loss_scale_period": period}
            for policy in ("inv_sqrt_dk", "none") for period in range(7)
            for lr in (1e-2, 3e-2) for seed in (0, 1)]
    fig = report_plots.plot_against_lr(rows, "final_val_bpb", "bpb", unit=None)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == 7 and len(fig.axes) == 8  # 2 rows of 4, the last empty
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["inv_sqrt_dk", "none"]
    titles = [ax.title.get_window_extent(renderer) for ax in shown]
    legend = fig.legends[0].get_window_extent(renderer)
    for i, (ax, title) in enumerate(zip(shown, titles, strict=True)):
        assert "loss_scale_period=" in ax.get_title()
        assert fig.bbox.x0 <= title.x0 and title.x1 <= fig.bbox.x1 + 1
        others = [*titles[:i], *titles[i + 1:], legend]
        others += [other.get_window_extent(renderer) for other in shown if other is not ax]
        assert not any(title.overlaps(box) for box in others), ax.get_title()


def one_dk_rows(lrs: tuple[float, ...]) -> list[dict]:
    """length_generalization's shape: 2 policies at one d_k, 3 seeds at each LR, with the
    degradation beyond n at L = 256 (seed s of policy p at LR lr: 0.1·(p+1) + lr·100 + s/10)."""
    return [{"policy": policy, "d_k": 32, "lr": lr, "seed": seed, "status": "completed",
             "final_val_bpb": 2.5 + lr, "final_val/bpb_degradation@256":
             0.1 * (p + 1) + lr * 100 + seed / 10}
            for p, policy in enumerate(("inv_sqrt_dk", "log_length")) for lr in lrs
            for seed in (0, 1, 2)]


def test_degradation_is_plotted_against_lr_with_its_zero_line():
    """Each policy's line passes through its seeds' mean degradation at each LR, and the grey
    zero line (the reference a difference is read against) is drawn and named."""
    rows = one_dk_rows((1e-3, 3e-3, 1e-2))
    fig = report_plots.row_plots(rows, plot_style.Style.of(rows))["degradation_vs_lr_256.png"]
    lines = drawn(fig)
    for p, policy in enumerate(("inv_sqrt_dk", "log_length")):
        ((_, line),) = lines[f"{policy}||32"]
        expected = [np.mean([0.1 * (p + 1) + lr * 100 + s / 10 for s in (0, 1, 2)])
                    for lr in (1e-3, 3e-3, 1e-2)]
        assert list(line.get_xdata()) == [1e-3, 3e-3, 1e-2]
        assert list(line.get_ydata()) == pytest.approx(expected)
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    assert any(list(line.get_ydata()) == [0.0, 0.0] for line in ax.get_lines())
    assert "no degradation (0)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_final_against_dk_is_drawn_only_where_it_adds_to_loss_against_lr():
    """One d_k with an LR grid: its best LRs are loss_vs_lr's minima, so no d_k plot; one d_k
    without a grid (the headline's shape) keeps it, being the only comparison drawn; so does a
    line across several d_k."""
    with_grid = one_dk_rows((1e-3, 3e-3))
    without = one_dk_rows((1e-3,))
    style = plot_style.Style.of(with_grid)
    assert "final_bpb_vs_dk.png" not in report_plots.row_plots(with_grid, style)
    assert "loss_vs_lr.png" in report_plots.row_plots(with_grid, style)
    assert "final_bpb_vs_dk.png" in report_plots.row_plots(without, style)
    # mup_transfer's shape: d_k moves with the width, a field with its own panel, so each panel
    # would again hold one d_k.
    by_width = [{**r, "d_k": width // 4, "override:model.d_model": width}
                for width in (64, 128) for r in with_grid]
    assert "final_bpb_vs_dk.png" not in report_plots.row_plots(by_width, style)
    across = [{**r, "d_k": d_k} for d_k in (16, 32) for r in with_grid]
    assert "final_bpb_vs_dk.png" in report_plots.row_plots(across, style)


def test_arms_without_a_fixed_width_and_rows_without_a_head_count():
    # Each width (heads × d_k) holds one d_k: no fixed-width arm, the head count is a setting.
    rows = [{"d_k": 16, "override:model.num_heads": 2}, {"d_k": 32, "override:model.num_heads": 2}]
    assert [plot_groups.arms(rows)(r) for r in rows] == [["num_heads=2"], ["num_heads=2"]]
    # A fixed-width arm (2 × 32 = 4 × 16 = 64), and a row that swept no head count: unnamed.
    rows = [{"d_k": 32, "override:model.num_heads": 2}, {"d_k": 16, "override:model.num_heads": 4},
            {"d_k": 16, "override:model.num_heads": ""}]
    assert [plot_groups.arms(rows)(r) for r in rows] == [["width 64"], ["width 64"], [""]]


def test_a_cell_two_arms_share_is_drawn_once_without_small_multiples():
    shared, own = [{"name": "a"}], [{"name": "b"}]
    series = {("p", "arm 1", 16): shared, ("p", "arm 2", 16): shared, ("p", "arm 2", 32): own}
    names = lambda members: tuple(r["name"] for r in members)  # noqa: E731
    once = plot_groups.drop_repeats(series, plot_groups.Grid((16, 32), (None,)), names)
    assert list(once) == [("p", "arm 1", 16), ("p", "arm 2", 32)]
    split = plot_groups.Grid((16, 32), ("arm 1", "arm 2"))
    assert plot_groups.drop_repeats(series, split, names) == series


def test_where_every_lr_diverged_the_one_that_lasted_longest_is_drawn():
    # Each LR's shortest-lived seed: 50 steps at 1e-3, 60 at 1e-2, 10 at 1e-1: 1e-2 lasted longest.
    rows = [{"name": f"p,{lr},{s}", "policy": "p", "d_k": 16, "lr": lr, "seed": s,
             "status": "diverged", "diverged_at_step": step, "final_val_bpb": None}
            for lr, steps in ((1e-3, (50, 70)), (1e-2, (60, 65)), (1e-1, (10, 90)))
            for s, step in enumerate(steps)]
    chosen = plot_groups.chosen_runs([r["name"] for r in rows], rows)
    assert {key: [run for run, _ in members] for key, members in chosen.items()} == {
        ("p", "", 16): ["p,0.01,0", "p,0.01,1"]}


def test_curves_over_training_need_a_point_between_their_ends():
    """A study that evaluates only at init and at the end (eval_every = steps) has no curve over
    training to show: no val_loss_curves.png, rather than one segment zoomed off its panel;
    one evaluation in between draws it."""
    config, points = grid("quick")
    for steps, drawn_expected in (((0, 300), False), ((0, 150, 300), True)):
        runs = syn.runs(config, points, steps)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(report, "_baselines", lambda config: dict(syn.BASELINES))
            rows = [report.summarise_run(run) for run in runs]
        figures = report_plots.build_plots(runs, rows)
        assert ("val_loss_curves.png" in figures) is drawn_expected, steps
