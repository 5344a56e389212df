"""The GPU kit's Markdown report, rendered from its JSON (bench/gpu_kit.py): one table per part."""

from __future__ import annotations


def _f(value, fmt: str = "{:.1f}", empty: str = "") -> str:
    return empty if value is None else fmt.format(value)


def _step_rows(results: list[dict]) -> list[str]:
    rows = ["| LLM | attention | packed | Liger | compiled | rows | ckpt | tokens/s | MFU | peak GiB | plan GiB | "
            "attention | GEMMs | loss | optimizer | other | vision tower | packed logits vs alone |",
            "|" + " --- |" * 18]
    for r in results:
        s = r.get("shares") or {}
        logits = r.get("packing_logit_error") or {}
        if r.get("error"):
            rows.append(f"| {r['arch']} | {r['attn']} | {r['packed']} | {r['liger']} | {r.get('compiled', False)} | "
                        f"{r.get('rows', '')} | "
                        f"{r['checkpointing']} | {r['error']} |" + " |" * 11)
            continue
        rows.append(
            f"| {r['arch']} | {r['attn']} | {'yes' if r['packed'] else 'no'} | {'on' if r['liger'] else 'off'} | "
            f"{'on' if r.get('compiled') else 'off'} | "
            f"{r['rows']} | {'on' if r['checkpointing'] else 'off'} | {r['tokens_per_s']:,.0f} | "
            f"{_f(r['mfu'], '{:.1%}', 'n/a')} | {_f(r['peak_mem_gib'])} | {_f(r['plan_gib'])} | "
            + " | ".join(_f(s.get(k), "{:.0%}") for k in ("attention", "GEMMs", "loss", "optimizer", "other",
                                                           "vision tower (timed alone)"))
            + f" | {_f(logits.get('relative'), '{:.2%} of max logit')} |")
    return rows


def _loss_rows(results: list[dict]) -> list[str]:
    rows = ["| vocabulary | kernel | less memory | time vs plain | plain ms | fused ms | plain GiB | fused GiB | "
            "target (>= 4x at <= 1.10x) |", "|" + " --- |" * 9]
    for r in results:
        rows.append(f"| {r['vocab']:,} | {r['kernel']} | {r['memory_ratio']:.1f}x | {r['time_ratio']:.2f}x | "
                    f"{r['plain_ms']:.2f} | {r['fused_ms']:.2f} | {r['plain_gib']:.2f} | {r['fused_gib']:.2f} | "
                    f"{'meets' if r['meets'] else 'misses'} |")
    return rows


def _train_rows(results: list[dict]) -> list[str]:
    rows = ["| run | rows x longest | tokens/s | plan peak GiB | measured GiB | measured vs plan | plan: states | "
            "plan: activations | layout | note |", "|" + " --- |" * 10]
    for r in results:
        note = r.get("skipped") or r.get("error") or r.get("why", "")
        if "planned_peak_gib" not in r:
            rows.append(f"| {r['run']} |" + " |" * 8 + f" {note} |")
            continue
        rows.append(f"| {r['run']} | {r['rows']} x {r['longest_row']} | {r['tokens_per_s']:,.0f} | "
                    f"{r['planned_peak_gib']:.2f} | {_f(r['measured_peak_gib'], '{:.2f}', 'not measured')} | "
                    f"{_f(r.get('measured_over_plan'), '{:+.1%}')} | {r['planned_states_gib']:.2f} | "
                    f"{r['planned_activations_gib']:.2f} | {r.get('planned_layout', '')} | "
                    f"{'; '.join(filter(None, (note, r.get('note'))))} |")
    return rows


TABLES = {"step_llama": _step_rows, "step_qwen": _step_rows, "fused_loss": _loss_rows, "train": _train_rows}


def markdown(data: dict) -> str:
    env = data["environment"]
    lines = [f"# GPU kit ({data['kit']}), {env['date']}", "",
             "; ".join(f"{k} {v}" for k, v in env.items() if k != "date"), ""]
    for name, part in data["parts"].items():
        lines += [f"## {name}: {part['status']}" + (f", {part['seconds']} s" if "seconds" in part else ""), ""]
        if part.get("command"):
            lines += [f"    {part['command']}", ""]
        if part.get("results") and name in TABLES:
            lines += TABLES[name](part["results"]) + [""]
        if part.get("status") != "ok" and part.get("tail"):
            lines += [f"    {line}" for line in part["tail"][-15:]] + [""]
    return "\n".join(lines)
