"""Matplotlib figures of the diagnostics (Agg backend: no display needed).

Owns only drawing: each function takes the numbers an analysis computed and returns a Figure;
saving is ``common.write_result``'s job.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

STAGES = (("vision_output", "vision output"), ("projector_output", "after projector"),
          ("norm_output", "after norm layer"), ("text_tokens", "text tokens"))


def interface_figure(rows: list[dict]):
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(rows) + 3), 4))
    width = 0.8 / (len(STAGES) + 1)
    x = np.arange(len(rows))
    for i, (key, name) in enumerate(STAGES):
        means = [r[key]["mean"] if r.get(key) and r[key]["mean"] else np.nan for r in rows]
        stds = [r[key]["std"] if r.get(key) and r[key]["std"] is not None else 0 for r in rows]
        ax.bar(x + i * width, means, width, yerr=stds, capsize=3, label=name)
    ax.bar(x + len(STAGES) * width, [r["text_norm_T"] for r in rows], width, label="T (its text embeddings)", hatch="//")
    ax.set_xticks(x + width * len(STAGES) / 2, [r["label"] for r in rows], rotation=15, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("mean L2 norm per token (log)")
    ax.set_title("Norms at the vision-language interface")
    ax.legend(fontsize=8)
    return fig


def top_rows_figure(result: dict, embedding_weight):
    norms = embedding_weight.detach().float().norm(dim=-1).cpu().numpy()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.hist(norms[norms > 0], bins=60, color="tab:gray")
    left.axvline(result["text_norm_T"], color="tab:red", label=f"T = {result['text_norm_T']:.3g}")
    left.set_yscale("log")
    left.set_xlabel("row L2 norm")
    left.set_ylabel("rows (log)")
    left.legend()
    rows = result["rows"][::-1]
    right.barh(range(len(rows)), [r["norm"] for r in rows], color="tab:blue")
    right.set_yticks(range(len(rows)), [f"{r['token']!r} ({r['token_id']})" for r in rows], fontsize=8)
    right.set_xlabel("L2 norm")
    right.set_title(f"top-{len(rows)} rows: {result['label']}")
    fig.tight_layout()
    return fig


def _curves_axes(title_suffix: str = ""):
    fig, (norm_ax, cos_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    norm_ax.set_xlabel("layer boundary (0 = LLM input)")
    norm_ax.set_ylabel("mean L2 norm")
    norm_ax.set_yscale("log")
    norm_ax.set_title("hidden-state norm" + title_suffix)
    cos_ax.set_xlabel("layer l (cosine between h_l and h_l+1)")
    cos_ax.set_ylabel("mean cosine similarity")
    cos_ax.set_title("update rate (higher = slower)" + title_suffix)
    for ax in (norm_ax, cos_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, norm_ax, cos_ax


def layers_figure(curves: list[dict]):
    fig, norm_ax, cos_ax = _curves_axes()
    colours = plt.cm.tab10(np.arange(len(curves)) % 10)
    for colour, c in zip(colours, curves):
        for group, style in (("image", "-"), ("text", "--")):
            if c[group]["norm"] is None:
                continue
            norm_ax.plot(c[group]["norm"], style, color=colour, label=f"{c['label']} {group}")
            cos_ax.plot(c[group]["cosine"], style, color=colour, label=f"{c['label']} {group}")
    cos_ax.legend(fontsize=7, title="solid: visual, dashed: text")
    fig.tight_layout()
    return fig


def dynamics_figure(curves: list[dict]):
    fig, (img_ax, txt_ax) = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(curves)))
    for ax, group in ((img_ax, "image"), (txt_ax, "text")):
        for colour, c in zip(colours, curves):
            if c[group]["cosine"] is not None:
                ax.plot(c[group]["cosine"], color=colour, label=c["label"])
        # No text tokens in these prompts (e.g. image-only samples): say so rather than draw nothing.
        empty = all(c[group]["cosine"] is None for c in curves)
        ax.set_title(f"{group} tokens: cos(h_l, h_l+1) over training" + (" (none in these prompts)" if empty else ""))
        ax.set_xlabel("layer l")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    img_ax.set_ylabel("mean cosine similarity")
    (img_ax if all(c["text"]["cosine"] is None for c in curves) else txt_ax).legend(fontsize=7)
    fig.tight_layout()
    return fig


def gains_figure(rows: list[dict]):
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows) + 2), 4))
    x = np.arange(len(rows))
    means = [r["gain_abs_mean"] if r["gain_abs_mean"] is not None else np.nan for r in rows]
    stds = [r["gain_abs_std"] or 0 for r in rows]
    ax.bar(x, means, yerr=stds, capsize=4, label="mean|g| ± std")
    init = [r["text_norm_init_abs_mean"] or np.nan for r in rows]
    ax.scatter(x, init, color="tab:red", marker="_", s=400, zorder=3, label="T/sqrt(d) (text-norm init)")
    ax.set_xticks(x, [r["label"] for r in rows], rotation=15, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("|g| (log)")
    ax.set_title("Norm-layer gain (Table 5)")
    ax.legend(fontsize=8)
    return fig


def gradients_figure(rows: list[dict], check: dict | None = None):
    keys = ("projector_output", "projector_linear_1", "projector_linear_2", "vision_tower")
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows) + 3), 4))
    width = 0.8 / len(keys)
    x = np.arange(len(rows))
    for i, key in enumerate(keys):
        values = [r["grad_norms"][key] if r["grad_norms"][key] else np.nan for r in rows]
        ax.bar(x + i * width, values, width, label=key.replace("_", " "))
    ax.set_xticks(x + width * (len(keys) - 1) / 2, [r["label"] for r in rows], rotation=15, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("gradient L2 norm (log)")
    title = "Gradient reaching the projector and vision tower (one batch)"
    if check and "projector_output" in check["observed_ratio"]:
        title += (f"\nwithout/with GWC: {check['observed_ratio']['projector_output']:.4g}"
                  f" (predicted mean|g| = {check['predicted_ratio_mean_abs_g']:.4g})")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def attention_figure(image, maps: list[dict], phrase: str):
    fig, axes = plt.subplots(1, len(maps) + 1, figsize=(3.2 * (len(maps) + 1), 3.4), squeeze=False)
    axes = axes[0]
    square = image.resize((256, 256))
    axes[0].imshow(square)
    axes[0].set_title("image")
    for ax, m in zip(axes[1:], maps):
        grid = np.asarray(m["grid"])
        ax.imshow(square)
        ax.imshow(grid, cmap="jet", alpha=0.5, extent=(0, 256, 256, 0), interpolation="nearest")
        ax.set_title(f"{m['label']}\nmass on image {m['attention_mass_on_image']:.2f}", fontsize=9)
    for ax in axes:
        ax.axis("off")
    fig.suptitle(f"attention from {phrase!r} to image patches")
    fig.tight_layout()
    return fig


def _forest_panel(ax, rows: list[tuple[str, float, float, float]], fontsize: int = 10) -> None:
    """Deltas with intervals on ``ax``, first row on top; grey where the interval covers 0."""
    y = np.arange(len(rows))[::-1]
    for yi, (_, estimate, low, high) in zip(y, rows):
        colour = "tab:gray" if low <= 0 <= high else "tab:green" if estimate > 0 else "tab:red"
        ax.errorbar(estimate, yi, xerr=[[estimate - low], [high - estimate]], fmt="o", color=colour, capsize=4)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [label for label, *_ in rows], fontsize=fontsize)


def forest_figure(rows: list[tuple[str, float, float, float]], title: str, xlabel: str):
    """Deltas with intervals, one row each: ``(label, estimate, low, high)``. A row whose
    interval covers 0 is grey: no detectable difference."""
    fig, ax = plt.subplots(figsize=(7, 0.42 * len(rows) + 1.4))
    _forest_panel(ax, rows)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def forest_grid(panels: dict[str, list[tuple[str, float, float, float]]], title: str):
    """One forest panel per benchmark (``panels[benchmark]`` rows as in ``forest_figure``),
    sharing the arm order, in a grid of up to three columns."""
    cols = min(3, len(panels))
    n_rows = -(-len(panels) // cols)
    height = 0.32 * max(len(rows) for rows in panels.values()) + 1.0
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, height * n_rows + 0.6), squeeze=False)
    for ax, (benchmark, rows) in zip(axes.flat, panels.items()):
        _forest_panel(ax, rows, fontsize=8)
        ax.set_title(benchmark, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def training_figure(curves: dict[str, dict[str, list[tuple[int, float]]]]):
    """Training loss against step: one panel per stage, one line per run. ``curves[stage][run]``
    holds ``(step, loss)`` pairs."""
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 3.6), squeeze=False)
    for ax, (stage, runs) in zip(axes[0], curves.items()):
        for colour, (run, points) in enumerate(runs.items()):
            if points:
                steps, losses = np.array(points).T
                ax.plot(steps, losses, color=f"C{colour}", lw=0.8, alpha=0.3)
                window = max(1, len(losses) // 25)  # a running mean shows the trend through batch noise
                smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
                ax.plot(steps[window - 1:], smooth, color=f"C{colour}", lw=1.6, label=f"{run} (running mean)")
        ax.set_title(stage)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
