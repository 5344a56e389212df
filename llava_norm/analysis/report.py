"""One Markdown page from the diagnostics' JSON files: key numbers as tables, figures embedded.

Owns the page layout only; every number comes from a ``<kind>.json`` an analysis wrote. Figures
are linked relative to the report, so the page renders wherever the folder is copied.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ORDER = ("interface_norms", "top_norm_rows", "layers", "dynamics", "gain_stats", "gradient_flow", "attention")
TITLES = {
    "interface_norms": "Norms at the interface (Tables 1-2)",
    "top_norm_rows": "Highest-norm embedding rows (App. C)",
    "layers": "Per-layer norms and update rates (Fig. 3-4)",
    "dynamics": "Update rates over training (App. F)",
    "gain_stats": "Norm-layer gain (Table 5)",
    "gradient_flow": "Gradient flow with and without GWC",
    "attention": "Text-to-image attention (App. G)",
}


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _pm(stats: dict | None) -> str:
    return "-" if not stats or stats.get("mean") is None else f"{stats['mean']:.4g} ± {stats['std']:.3g}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]


def _interface(r: dict) -> list[str]:
    rows = [[x["label"], _pm(x["vision_output"]), _pm(x["projector_output"]), _pm(x["norm_output"]),
             x["text_norm_T"], _pm(x["text_tokens"])] for x in r["rows"]]
    return [f"{r['images']} images from `{r['source']}`, {len(r['prompts'])} text prompts; T is the mean norm of "
            "each model's own text embeddings (stage 2 trains them, so it can differ from the T its norm layer was "
            "built with, which the gains' table uses).", ""] + _table(
        ["model", "vision output", "after projector", "after norm layer", "T (its embeddings)", "text tokens"], rows)


def _top_rows(r: dict) -> list[str]:
    rows = [[x["rank"], f"`{x['token']!r}`", x["token_id"], x["norm"]] for x in r["rows"]]
    return [f"`{r['label']}`: T = {r['text_norm_T']:.4g}, median row norm {r['median_norm']:.4g}, "
            f"{r['zero_rows']} zero rows of {r['vocab_rows']}.", ""] + _table(["rank", "token", "id", "norm"], rows)


def _curves(r: dict) -> list[str]:
    rows = []
    for c in r["curves"]:
        for group in ("image", "text"):
            if c[group]["cosine"] is None:
                continue
            cos = c[group]["cosine"]
            rows.append([c["label"], group, c[group]["tokens"], c[group]["norm"][0], c[group]["norm"][-1],
                         sum(cos) / len(cos), min(cos)])
    return _table(["model", "tokens", "count", "norm at input", "norm at last layer", "mean cosine",
                   "min cosine"], rows)


def _gains(r: dict) -> list[str]:
    rows = [[x["label"], x["norm_alignment"], x["gain_l2"], x["gain_abs_mean"], x["gain_abs_std"],
             x["bias_abs_mean"], x["text_norm_init_abs_mean"]] for x in r["rows"]]
    # Pipes inside a Markdown table cell must be escaped or they split the cell.
    return ["T/√d is the text-norm initialisation's mean of |g|, from the T the model was built with (its "
            "config's `text_norm`).", ""] + _table(
        ["model", "arm", "‖g‖", r"mean\|g\|", r"std\|g\|", r"mean\|b\|", "T/√d (T as built)"], rows)


def _gradients(r: dict) -> list[str]:
    keys = ("projector_output", "projector_linears", "vision_tower", "norm_gain")
    rows = [[x["label"], x["loss"], *[x["grad_norms"][k] for k in keys]] for x in r["rows"]]
    lines = [f"One batch of {r['batch_size']} samples, every parameter trainable.", ""]
    lines += _table(["model", "loss", *keys], rows)
    check = r.get("gwc_check")
    if check:
        observed = ", ".join(f"{k} {v:.4g}" for k, v in check["observed_ratio"].items())
        lines += ["", f"Without/with GWC gradient ratio: {observed}; predicted mean|g| = "
                      f"{check['predicted_ratio_mean_abs_g']:.4g}."]
    return lines


def _attention(r: dict) -> list[str]:
    rows = [[m["label"], " ".join(f"`{t}`" for t in m["query_tokens"]), m["attention_mass_on_image"]] for m in r["maps"]]
    return [f"Prompt: {r['prompt']!r}; phrase {r['phrase']!r}; image `{r['image']}`.", ""] + _table(
        ["model", "query tokens", "attention mass on image"], rows)


SECTIONS = {"interface_norms": _interface, "top_norm_rows": _top_rows, "layers": _curves, "dynamics": _curves,
            "gain_stats": _gains, "gradient_flow": _gradients, "attention": _attention}


def load_results(folder: str | Path) -> list[tuple[Path, dict]]:
    """Every analysis JSON in the folder, in the paper's order."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (from {Path.cwd()})")
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError as error:  # JSON's and UTF-8's: a file cut short or edited, named
            raise ValueError(f"{path}: not readable JSON ({error}); delete it or write it again") from None
        if isinstance(data, dict) and data.get("analysis") in SECTIONS:
            found.append((path, data))
    return sorted(found, key=lambda item: ORDER.index(item[1]["analysis"]))


def write_report(folders: list[str | Path], out_path: str | Path, title: str = "llava-norm diagnostics") -> Path:
    """Write the Markdown page; raises if no analysis JSON is found."""
    out = Path(out_path)
    results = [item for folder in folders for item in load_results(folder)]
    if not results:
        raise FileNotFoundError(f"no analysis JSON (with an 'analysis' key) in {[str(f) for f in folders]}")
    lines = [f"# {title}", ""]
    for path, data in results:
        lines += [f"## {TITLES[data['analysis']]}", "", *SECTIONS[data["analysis"]](data), ""]
        figure = path.parent / data.get("figure", "")
        if data.get("figure") and figure.is_file():
            rel = os.path.relpath(figure, out.parent)
            lines += [f"![{data['analysis']}]({rel})", ""]
        lines += [f"Numbers: [{path.name}]({os.path.relpath(path, out.parent)})", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    return out
