"""The figures in the README and docs that the code can compute, held against the code.

Each figure is produced by the command its doc names; a change to the plan, the configs or the
FLOP model that moves a figure fails here until the doc says the new one.
"""

import ast
import json
import math
import re
import sys
from pathlib import Path

from llava_norm.config import load_config
from llava_norm.plan import format_plan, gpu_memory, make_plan
from llava_norm.plan.backbones import backbone_config, vision_part
from llava_norm.stats import t_quantile

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RECIPE = (ROOT / "docs/one_gpu_recipe.md").read_text()


def _plan(config: str, gpus: int, gpu: str, *overrides: str):
    return make_plan(load_config(ROOT / config, list(overrides), check_paths=False), gpus, 1, gpu_memory(gpu), gpu)


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start:end if end > 0 else None]


def test_the_readmes_plan_output_is_what_the_command_prints(monkeypatch):
    section = _section(README, "### Before launch: `llava-norm plan`")
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    command = blocks[0][1].splitlines()[0].split()
    assert command[:2] == ["llava-norm", "plan"] and command[3:] == ["--gpus", "8", "--gpu", "h100-80gb"]
    monkeypatch.chdir(ROOT)  # the config names the DeepSpeed file relative to the checkout
    printed = format_plan(_plan(command[2], 8, "h100-80gb")).splitlines()
    shown = blocks[1][1].rstrip("\n").splitlines()
    # The README abbreviates long lines with "(...)"; it shows every printed line, in order, but the
    # two opening lines and the host memory line it says it leaves out.
    heads = [line.split("(...)")[0].rstrip() if "(...)" in line else line.rstrip() for line in shown]
    assert "(its opening lines, naming the config and the backbones, and its host memory line left out)" in \
        " ".join(section.split())
    kept = [p for p in printed[2:] if not p.startswith("  host memory per node at start-up: ")]
    assert printed[0].startswith("plan for ") and printed[1].startswith("  backbones: ") and len(kept) == len(printed) - 3
    assert len(heads) == len(kept) and all(h and p.rstrip().startswith(h) for h, p in zip(heads, kept)), \
        "README's lines against the printed ones:\n" + "\n".join(shown) + "\n--\n" + "\n".join(printed)


RECIPE_ARMS = ["none", "ln_default", "ln_textnorm", "ln_textnorm_gwc", "rms_textnorm", "rms_textnorm_gwc",
               "scale_to_t", "scale_fixed", "scale_learned"]


def test_the_recipes_memory_is_the_plans_worst_arm(monkeypatch):
    monkeypatch.chdir(ROOT)
    line = next(line for line in RECIPE.splitlines() if line.startswith("| memory |"))
    assert "llava-norm plan configs/recipe-1gpu/<arm>/stage{1,2}.yaml --gpus 1 --gpu h100-80gb" in line
    shown = [float(x) for x in re.search(r"at most ([\d.]+) / ([\d.]+) GiB", line).groups()]
    for stage, figure in zip((1, 2), shown):
        peaks = [_plan(f"configs/recipe-1gpu/{arm}/stage{stage}.yaml", 1, "h100-80gb").peak() / 2 ** 30
                 for arm in RECIPE_ARMS]
        assert figure == round(max(peaks), 1), (stage, peaks)


def test_the_readmes_host_memory_and_output_weight_figures_are_the_plans(monkeypatch):
    """The fp32 model each rank holds at start-up (the plan's host memory over 8 processes), the
    output weight ZeRO-3 keeps gathered under the fused loss, and the 3B checkpoint's size at 16
    bytes a trained parameter, from the shipped configs."""
    monkeypatch.chdir(ROOT)
    flat = " ".join(README.split())  # the figures as read, wherever the lines wrap
    for model, shown in (("llama3.2-3b", "13.6 GiB per rank for the Llama-3.2-3B"),
                         ("qwen2.5-7b", "and 30.0 GiB for Qwen2.5-7B")):
        plan = _plan(f"configs/{model}/none/stage2.yaml", 8, "h100-80gb")
        assert f"{plan.host_memory_gib() / 8:.1f} GiB" in shown and shown in flat, (model, plan.host_memory_gib())
        if model == "llama3.2-3b":
            trained = plan.trained
            assert f"each of the {trained / 1e9:.1f}B trained" in flat and f"about {16 * trained / 1e9:.0f} GB" in flat
    llm = backbone_config("Qwen/Qwen2.5-7B-Instruct", "model.llm").config
    shown = f"({llm.vocab_size * llm.hidden_size * 2 / 2**30:.2f} GiB more per GPU at Qwen2.5-7B in bf16: its " \
            f"{llm.vocab_size:,} x {llm.hidden_size:,} output weight"
    assert shown in flat


def test_the_recipes_steps_image_tokens_and_t_factor():
    for stage, shown in ((1, 195), (2, 312)):
        config = load_config(ROOT / f"configs/recipe-1gpu/none/stage{stage}.yaml", check_paths=False)
        t, take = config.train, config.data.mixture[0].take
        rows = int(take.split(":")[1])
        # the Trainer's optimizer steps per epoch on one GPU: micro-batches, then whole accumulations
        steps = math.ceil(rows / t.per_device_batch_size) // (t.global_batch_size // t.per_device_batch_size)
        assert steps == shown and f"{shown} steps" in RECIPE
    vision = vision_part(backbone_config("google/siglip-base-patch16-224", "model.vision_tower").config)
    tokens = (vision.image_size // vision.patch_size) ** 2
    assert tokens == 196 and f"SigLIP-base-patch16-224 ({tokens} image tokens)" in RECIPE
    factor = t_quantile(0.975, 2) / math.sqrt(3)  # a 95% t interval's half-width over 3 seeds, in sds
    assert f"about {factor:.1f} times the standard deviation" in RECIPE


def test_the_recipes_time_table_is_what_recipe_time_prints(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import recipe_time  # bench/, on the path for this test only

    for mfu in (0.30, 0.15):
        per_chain = sum(recipe_time.chain_seconds(mfu).values())
        row = f"| {mfu:.2f} | {per_chain / 60:.1f} min | {recipe_time.ARMS * recipe_time.SEEDS * per_chain / 3600:.1f} h |"
        assert row in RECIPE, row
    sys.modules.pop("recipe_time", None)
    sys.modules.pop("gpu_step", None)


def _pins(text: str) -> dict[str, str]:
    return {name.lower(): version for name, version in re.findall(r"([A-Za-z][\w.-]*)==([\w.+-]+)", text)}


def _bench_prints(script: str, args: list[str], monkeypatch, capsys) -> str:
    """What ``bench/<script> <args>`` prints, run in this process (the libraries are loaded already)."""
    import runpy

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setattr(sys, "argv", [script, *args])
    capsys.readouterr()
    runpy.run_path(str(ROOT / "bench" / script), run_name="__main__")
    return capsys.readouterr().out


def test_the_readmes_packing_and_padding_figures_are_what_the_bench_scripts_print(monkeypatch, capsys):
    flat = " ".join(README.split())
    packing = _bench_prints("packing.py", [], monkeypatch, capsys)
    fill = {int(b): float(f) for b, f in re.findall(r"row budget (\d+) \(.*\): lowest fill ([\d.]+)%", packing)}
    assert (f"packed rows of 4096 / 8192 tokens are filled to {fill[4096]:.0f}% / {fill[8192]:.0f}% of their budget "
            f"(`bench/packing.py`; rows of exactly `data.max_length` fill {fill[2048]:.0f}%") in flat
    worst = {}
    for estimate in ("tokens", "words"):
        printed = _bench_prints("padding.py", ["--length-estimate", estimate], monkeypatch, capsys)
        worst[estimate] = re.search(r"worst grouped padding share: ([\d.]+%) at per-device batch 16", printed).group(1)
    assert (f"(`bench/padding.py`, then `--length-estimate words`: {worst['tokens']} vs {worst['words']} at "
            "per-device batch 16)") in flat


def test_the_cluster_docs_pin_what_the_requirements_files_and_makefile_pin():
    doc = _pins((ROOT / "docs/cluster.md").read_text())
    pinned = {}
    for name in ("requirements.txt", "requirements-gpu.txt", "requirements-flash-attn.txt", "Makefile"):
        pinned.update(_pins("\n".join(line.split("#")[0] for line in (ROOT / name).read_text().splitlines())))
    assert {"torch", "uv", "liger-kernel", "flash-attn", "ninja", "packaging"} <= set(doc)
    assert {name: doc[name] for name in doc} == {name: pinned.get(name) for name in doc}


def test_the_cluster_docs_world_sizes_are_what_check_names(monkeypatch):
    """docs/cluster.md's example: the paper's stage 2 on 6 nodes of 8 GPUs is refused, naming the
    world sizes that work, as `llava-norm check CONFIG --gpus 8 --nodes 6` prints them."""
    from llava_norm.train.preflight import preflight

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    report = preflight(ROOT / "configs/llama3.2-3b/ln_textnorm_gwc/stage2.yaml", [], gpus=8, nodes=6, plan=False)
    refused = next(p for p in report.problems if "key 'train.global_batch_size'" in p)
    sizes = re.search(r"world sizes that work: \[([\d, ]+)\]", refused).group(1)
    doc = " ".join((ROOT / "docs/cluster.md").read_text().split())
    assert "128 rows per step cannot be split over 6 node(s) x 8 GPUs" in refused
    assert f"`llava-norm check CONFIG --gpus 8 --nodes 6` refuses it and names the world sizes that work ({sizes})" in doc


def test_the_cluster_docs_download_every_shipped_backbone():
    from llava_norm.plan.backbones import SHIPPED_BACKBONES

    shipped = {str(p.parent.relative_to(SHIPPED_BACKBONES)) for p in SHIPPED_BACKBONES.glob("*/*/config.json")}
    text = (ROOT / "docs/cluster.md").read_text()
    models = set(re.findall(r"^hf download (\S+)$", text, re.M))
    assert models == shipped
    # the two datasets, with the commands data/README.md gives (one source of how to fetch them)
    data_readme = (ROOT / "data/README.md").read_text()
    for line in (line for line in data_readme.splitlines() if line.startswith("hf download")):
        assert line in text, line


def test_the_readmes_run_paths_are_where_the_configs_and_the_pipeline_write():
    """A run path in the README (runs/<backbone>/<arm>/<stage>) is the output_dir of that config,
    and so also where `pipeline.sh --runs runs/<backbone>` puts the same step."""
    paths = set(re.findall(r"runs/([\w.-]+)/(\w+)/(stage1|stage2|stage2_lora)\b", README))
    assert paths
    for backbone, arm, stage in sorted(paths):
        config = load_config(ROOT / f"configs/{backbone}/{arm}/{stage}.yaml", check_paths=False)
        assert config.train.output_dir == f"runs/{backbone}/{arm}/{stage}", (backbone, arm, stage)
    assert "scripts/pipeline.sh --runs runs/llama3.2-3b" in README


def test_readme_gpu_figures_are_the_kits_recorded_results():
    """The README's H100 and H200 figures are those in bench/results/ (the kit's own JSON and output), not retyped ones."""
    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    train = json.loads((results / "gpu_kit_2026-11-26_train.json").read_text())["parts"]["train"]["results"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    steps = json.loads((results / "gpu_kit_2026-11-26_compile.json").read_text())["parts"]["step_llama"]["results"]
    best = max((r for r in steps if r["mfu"] and not r["error"]), key=lambda r: r["mfu"])
    assert best["attn"] == "flex_attention" and best["compiled"] and best["rows"] == "4x8x1029"
    assert f"stage-2 MFU **{best['mfu']:.1%}**" in readme
    mfu = {(r["attn"], r["compiled"]): r["mfu"] for r in steps if r["rows"] == "4x8x1029"}
    flat = " ".join(readme.split())
    assert f"no checkpointing; sdpa {mfu['sdpa', True]:.1%})" in flat
    # compiled against eager, each attention implementation against itself
    assert (f"against {mfu['flex_attention', False]:.1%} for the same step eager with FlexAttention "
            f"(sdpa {mfu['sdpa', False]:.1%})") in flat
    assert (f"from {mfu['sdpa', False]:.1%} to {mfu['sdpa', True]:.1%} MFU with sdpa and from "
            f"{mfu['flex_attention', False]:.1%} to {mfu['flex_attention', True]:.1%} with FlexAttention") in flat
    h200 = {r["attn"]: r["mfu"] for line in (results / "gpu_2026-11-28_step_compiled.txt").read_text().splitlines()
            if line.startswith("KIT-RESULT ") for r in [json.loads(line[len("KIT-RESULT "):])]}
    assert f"the same compiled 3B step reached {h200['sdpa']:.1%} with sdpa (FlexAttention {h200['flex_attention']:.1%})" in flat
    checks = {}  # the logit check's printed dicts, by attention implementation
    for line in (results / "gpu_2026-11-26_logit_check.txt").read_text().splitlines():
        if "packed logits vs alone:" in line:
            checks[line.split()[1]] = ast.literal_eval(line.split("packed logits vs alone: ", 1)[1])
    assert f"by {checks['sdpa']['relative']:.2%} of the largest logit (sdpa; FlexAttention " \
           f"{checks['flex_attention']['relative']:.2%})" in flat
    assert f"({checks['sdpa']['bf16_floor']:.2%} against fp32)" in flat
    assert checks["sdpa"]["over_floor"] < 1 and checks["flex_attention"]["over_floor"] < 1
    small = next(r for r in train if r["run"] == "qwen0.5b_zero2")
    assert f"peaked {abs(small['measured_over_plan']):.1%} under the" in readme.replace("\n", " ")
    # the elementwise ("other") share of GPU time, eager against compiled, at the same rows
    other = {(r["attn"], r["compiled"]): r["shares"]["other"] for r in steps if r["rows"] == "4x8x1029" and r["shares"]}
    compiled = sorted(f"{v:.0%}" for (_, c), v in other.items() if c)
    assert (f"the elementwise kernels from {other['sdpa', False]:.0%} of the GPU time to "
            f"{compiled[0].rstrip('%')}-{compiled[-1]}") in flat
    qwen = [json.loads(r) for r in re.findall(r"KIT-RESULT (.*)", (results / "gpu_2026-11-26_qwen_compiled.txt").read_text())]
    assert f"at Qwen2.5-7B with checkpointing the compiled step reached {max(r['mfu'] for r in qwen):.1%}" in flat
    liger = re.search(r"sdpa liger 4x8x1029 .* MFU ([\d.]+%)", (results / "gpu_2026-11-26_liger_llama.log").read_text())
    assert f"Liger's layer kernels gave the eager step {liger.group(1)}" in flat


def test_readme_plan_against_the_accumulated_steps_is_this_codes_plan(monkeypatch):
    """"within 1% of the steps with gradient accumulation": the peaks measured on the H100 (3B
    eager, 8 rows x 1029 tokens; 7B compiled, with checkpointing, 4 rows), against the plan this code makes
    for those steps with 4 accumulated micro-batches (the JSON's plan column predates that fix)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpu_step  # bench/, on the path for this test only

    results = ROOT / "bench" / "results"
    steps = json.loads((results / "gpu_kit_2026-11-26_compile.json").read_text())["parts"]["step_llama"]["results"]
    llama = next(r for r in steps if (r["attn"], r["compiled"], r["rows"]) == ("sdpa", False, "4x8x1029"))
    qwen = next(r for r in map(json.loads, re.findall(r"KIT-RESULT (.*)", (results / "gpu_2026-11-26_qwen_compiled.txt")
                                                    .read_text())) if (r["attn"], r["rows"]) == ("sdpa", "4x4x1029"))
    vision = gpu_step.siglip_so400m_384()
    tokens = (vision.image_size // vision.patch_size) ** 2
    offs = []
    for name, measured, batch, ckpt in (("llama-3.2-3b", llama, 8, False), ("qwen2.5-7b", qwen, 4, True)):
        # the steps the README names: the 3B one eager, the 7B one compiled (its file's only kind)
        assert (measured["accum"], measured["checkpointing"], measured["batch"], measured["compiled"]) == (
            4, ckpt, batch, ckpt)
        planned = gpu_step.planned_peak(vision, gpu_step.shipped(gpu_step.LLMS[name]), tokens, "ln_textnorm_gwc",
                                        gpu_step.PAPER_TEXT_NORM[name], batch, 1029 - tokens, ckpt, accum=4) / 2**30
        offs.append(measured["peak_mem_gib"] / planned - 1)
    sys.modules.pop("gpu_step", None)
    assert max(abs(o) for o in offs) <= 0.01, offs
    assert "and within 1% of the steps with gradient accumulation (3B eager; 7B compiled, with checkpointing)" in \
        " ".join(README.split())


def _logged_steps(log: str) -> list[dict]:
    """A trainer log's step entries, each the dict the Trainer printed (after any progress bar on its line)."""
    return [ast.literal_eval(line[line.index("{'loss'"):line.rindex("}") + 1])
            for line in log.splitlines() if "{'loss'" in line]


def _span(values, unit: str = "x") -> str:
    low, high = min(values), max(values)
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def test_readme_fused_loss_and_3b_trainer_figures_are_the_recorded_ones(monkeypatch, tmp_path):
    """The third H100 session's figures in the README: the shipped torch kernel's (the run with the
    shipped block size), Liger's and Cut Cross-Entropy's over both kit calls, and the 3B ZeRO-2
    trainer runs' peak against the plan this code computes and their throughput from their logs."""
    results = ROOT / "bench" / "results"
    flat = " ".join(README.split())
    # the compiled softmax (2026-11-27): its recorded rise lacks the two gradients the base held
    # (bench/RESULTS.md), added back here as the RESULTS table does
    compiled = {r["vocab"]: r for r in map(json.loads, re.findall(
        r"KIT-RESULT (.*)", (results / "gpu_2026-11-27_fused_compiled.txt").read_text())) if r["kernel"] == "torch@512MiB+compiled"}
    figures = {v: (f"{r['plain_gib'] / (r['fused_gib'] + (r['tokens'] + v) * r['hidden'] * 2 / 2**30):.1f}",
                   f"{r['time_ratio']:.2f}") for v, r in compiled.items()}
    (m1, t1), (m2, t2) = figures[128256], figures[152064]
    assert (f"used {m1}x less peak memory than the plain loss step at {t1}x its time (vocabulary 128,256; "
            f"{m2}x at {t2}x at 152,064)") in flat
    assert f"its softmax compiled: {m1}-{m2}x less memory than the plain loss step at {t1}-{t2}x its time" in flat
    shipped = (results / "gpu_2026-11-26_fused_blocks.txt").read_text().split("BLOCK_MIB 64\n")[1].split("BLOCK_MIB")[0]
    eager = sorted(float(t) for t in re.findall(r"vocab\s+\d+ torch@512MiB: [\d.]+x less memory at ([\d.]+)x", shipped))
    assert f"With the eager blocks it had taken {eager[0]:.2f}-{eager[-1]:.2f}x the time" in flat
    kits = [r for name in ("loss_train", "loss_liger")
            for r in json.loads((results / f"gpu_kit_2026-11-26_{name}.json").read_text())["parts"]["fused_loss"]["results"]]
    spans = {k: (_span({f"{r['memory_ratio']:.1f}" for r in kits if r["kernel"] == k}),
                 _span({f"{r['time_ratio']:.2f}" for r in kits if r["kernel"] == k})) for k in ("liger", "cce")}
    assert (f"Liger's kernel {spans['liger'][0]} less memory at {spans['liger'][1]} the time and Cut Cross-Entropy's "
            f"{spans['cce'][0]} less at {spans['cce'][1]}") in flat
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import _kit_train  # bench/, on the path for this test only

    run = next(r for r in _kit_train.TRAIN_RUNS if r.name == "llama3b_zero2")
    rates = {}
    for name in ("llama3b_zero2", "llama3b_zero2_compiled"):
        log = (results / f"gpu_2026-11-26_train_{name}.log").read_text()
        steps = _logged_steps(log)
        later = steps[3:]
        rates[name] = sum(h["tokens"] for h in later) / sum(h["tokens"] / float(h["tokens_per_second"]) for h in later)
        peak, longest = max(float(h["peak_memory_gib"]) for h in steps), max(h["longest_row"] for h in steps)
    config = tmp_path / "kit.yaml"  # the kit's YAML with hub ids: the plan reads the shipped backbone configs
    config.write_text(_kit_train._config_text(run, run.vision, run.llm, tmp_path, tmp_path, "stage2.yaml", 20))
    # planned as it ran: ZeRO-2's bucket was then `auto`
    planned = _kit_train._plan(config, longest, (f"train.deepspeed={ROOT}/bench/zero2_bucket_auto.json",)).peak() / 2**30
    assert f"{peak / planned - 1:.1%} over it ({peak:.2f} against {planned:.2f} GiB" in flat
    assert (f"slower than eager ({rates['llama3b_zero2_compiled']:,.0f} against {rates['llama3b_zero2']:,.0f} "
            f"tokens/s over steps 4-20") in flat


def test_readme_cudnn_attention_figures_are_the_profiled_runs():
    """The 3B trainer runs on one H200 with cuDNN's attention (bench/gpu_trainer_ab.sh's A), without
    it (D) and with the fused loss (F): tokens/s over steps 4-17 and between the stalls, the stalled
    steps' range, the fused run's losses against D's, all from their 2026-11-28 logs; and the two
    H100 runs with cuDNN stalled at the same four steps."""
    results, flat = ROOT / "bench" / "results", " ".join(README.split())
    logs = {"A": "gpu_2026-11-28_train_A_cudnn.log", "D": "gpu_2026-11-28_train_D_nocudnn.log",
            "F": "gpu_2026-11-28_train_F_fused_nocudnn.log", "B": "gpu_2026-11-27_train_B_expandable.log",
            "O": "gpu_2026-11-26_train_llama3b_zero2.log"}
    stalls, window = (3, 6, 7, 15), range(4, 18)
    rate, between, seconds, losses = {}, {}, {}, {}
    for run, name in logs.items():
        steps = _logged_steps((results / name).read_text())
        seconds[run] = {i + 1: int(h["tokens"]) / float(h["tokens_per_second"]) for i, h in enumerate(steps)}
        tokens = {i + 1: int(h["tokens"]) for i, h in enumerate(steps)}
        losses[run] = [float(h["loss"]) for h in steps]
        rate[run] = sum(tokens[i] for i in window) / sum(seconds[run][i] for i in window)
        calm = [i for i in window if i not in stalls]
        between[run] = sum(tokens[i] for i in calm) / sum(seconds[run][i] for i in calm)
    for run in "ABO":  # with cuDNN: those four steps stall, on the H200 and on both H100s
        assert min(seconds[run][i] for i in stalls) > 2 > max(seconds[run][i] for i in range(2, 18) if i not in stalls)
    stalled, calm = [seconds["A"][i] for i in stalls], [seconds["D"][i] for i in stalls]
    assert (f"the run without cuDNN made {rate['D']:,.0f} tokens/s over steps 4-17 and the run with it "
            f"{rate['A']:,.0f}. With cuDNN, steps 3, 6, 7 and 15 took {min(stalled):.1f}-{max(stalled):.1f} s "
            f"against {min(calm):.1f}-{max(calm):.1f} s without it") in flat
    assert f"{between['D']:,.0f} tokens/s against {between['A']:,.0f}" in flat
    assert (f"stalled for {min(stalled):.1f}-{max(stalled):.1f} s (one H200, 2026-11-28: {rate['A']:,.0f} "
            f"tokens/s; without cuDNN, `train.cudnn_attention: false`, now the default, {rate['D']:,.0f};") in flat
    gpu = {run: float(re.search(r"Self CUDA time total: ([\d.]+)s", (results / logs[run]).read_text()).group(1)) / 3
           for run in "ADB"}  # three profiled steps each
    d27 = float(re.search(r"Self CUDA time total: ([\d.]+)s",
                          (results / "gpu_2026-11-27_train_D_expandable_nocudnn.log").read_text()).group(1)) / 3
    assert (f"the GPU's own kernel time per profiled step was higher, {gpu['D']:.2f} s against {gpu['A']:.2f} "
            f"({d27:.2f} against {gpu['B']:.2f} on an H100, 2026-11-27)") in flat
    largest = max(abs(f - d) for f, d in zip(losses["F"], losses["D"], strict=True))
    assert (f"(largest difference {largest:.3f} over {len(losses['F'])} steps) at "
            f"{rate['F'] / rate['D']:.2f}x its tokens/s") in flat


def test_readme_zero2_bucket_figures_are_the_bench_output_and_the_plan(monkeypatch):
    """The ZeRO-2 bucket paragraph: the CPU overheads and the tiny stack's bucket against its mean
    tensor from zero_overhead.py's recorded output; the 3B's trained tensors against its `auto`
    bucket from the plan's meta model; the buckets' memory from the plan's term for zero2.json."""
    from llava_norm.plan.backbones import meta_model
    from llava_norm.plan.estimate import _freeze, gradient_bucket_bytes
    from llava_norm.plan.memory import PLAN_ATTENTION

    monkeypatch.chdir(ROOT)
    flat = " ".join(README.split())
    raw = (ROOT / "bench" / "results" / "cpu_2026-11-28_zero_overhead.txt").read_text()
    over = dict(re.findall(r"reduce_bucket_size (\S+) .*?\+([\d.]+) ms over no DeepSpeed", raw))
    elements, tensors = (int(x.replace(",", "")) for x in re.search(r"trained: ([\d,]+) elements in (\d+)", raw).groups())
    tiny = 96 ** 2  # the tiny LLM's hidden size, squared
    assert (f"(679 trained tensors; `auto` {tiny * tensors / elements:.1f} times their mean), ZeRO-2 added "
            f"{over['auto']} ms a step over no DeepSpeed with `auto` and {over['5e4']} ms with a bucket "
            f"{50_000 / tiny:.1f} times larger, as 5e7 is") in flat
    config = load_config("configs/llama3.2-3b/ln_textnorm_gwc/stage2.yaml", check_paths=False)  # as profiled
    model = meta_model(config.model, attn_implementation=PLAN_ATTENTION)[0]
    _freeze(model, config)
    trained = [p.numel() for p in model.parameters() if p.requires_grad]
    square = model.config.text_config.hidden_size ** 2
    assert (f"a bucket of {len(trained) * square / sum(trained):.1f} times the mean of its {len(trained)} trained "
            f"tensors, smaller than {sum(n > square for n in trained)} of them") in flat
    assert f"as 5e7 is {50_000_000 / square:.1f} times the 3B's `auto`" in flat
    shipped = json.loads((ROOT / "configs" / "deepspeed" / "zero2.json").read_text())
    size = gradient_bucket_bytes(shipped, model.config.text_config.hidden_size, "bf16")
    assert f"The two buckets take {size / 2 ** 30:.2f} GiB of GPU memory in bf16 through each backward" in flat


def test_the_readme_names_what_the_paper_module_compares():
    """The README's `--paper` paragraph names the backbones, arms and columns of
    `llava_norm/evaluation/paper.py`, and prints none of its numbers (they live there only)."""
    from llava_norm.evaluation.paper import BACKBONES, COLUMNS, METHODS, TABLE_4
    from llava_norm.evaluation.table import headline

    start = README.index("**The paper's numbers beside ours**")
    paragraph = README[start:README.index("\n\n", start)]
    flat = " ".join(paragraph.split())
    for backbone in BACKBONES:
        assert backbone.llm.split("/")[1] in flat and backbone.vision_tower.split("/")[1] in flat.lower()
    for arm, method in METHODS.items():
        assert f"`{arm}`" in flat and method in flat
    for benchmark in COLUMNS:
        assert headline(benchmark).column in flat
    assert not [v for row in TABLE_4.values() for v in row.values() if f"{v:.2f}" in flat]


def test_the_readme_counts_the_breaks_check_breaks_applies():
    from breaks import BREAKS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"`make check-breaks` applies {len(BREAKS)} of those breaks" in " ".join(readme.split())


def test_every_break_still_finds_the_line_it_edits():
    """A break whose line the code no longer has would leave `make check-breaks` checking nothing."""
    from breaks import BREAKS, ROOT

    assert [b.name for b in BREAKS if (ROOT / b.path).read_text().count(b.old) != 1] == []


def test_the_tests_readmes_checked_rows_are_the_breaks_tests():
    """A row of tests/README.md marked **checked** names a test that a break of tests/breaks.py
    names, and each break's test has such a row: the mark says the break is applied and caught."""
    from breaks import BREAKS

    def test_of(node: str) -> str:  # a parametrised node's function, from the tests folder
        return re.sub(r"\[.*\]$", "", node.removeprefix("tests/"))

    rows = [line for line in (ROOT / "tests/README.md").read_text().splitlines() if line.startswith("| `")]
    named = {test_of(re.match(r"\| `([^`]+)`", row).group(1)): "**checked**" in row for row in rows}
    broken = {test_of(b.test) for b in BREAKS}
    # a row may name a whole module (its checked case is said in the row)
    assert [t for t, checked in named.items() if checked and not any(b == t or b.startswith(f"{t}::") for b in broken)] == []
    assert [b for b in broken if not named.get(b, named.get(b.split("::")[0]))] == []


def test_the_tests_readme_quotes_the_command_make_test_runs():
    makefile = (ROOT / "Makefile").read_text()
    jobs = re.search(r"^TEST_JOBS \?= (\d+)$", makefile, re.M).group(1)
    recipe = re.search(r"^test: .*\n\t\$\(PY\) -m (pytest .*)$", makefile, re.M).group(1).replace("$(TEST_JOBS)", jobs)
    assert f"`{recipe.replace(' -q', '')}`" in " ".join((ROOT / "tests/README.md").read_text().split())


def test_the_modules_scheduled_first_exist():
    from conftest import LONGEST_FIRST

    assert all((ROOT / "tests" / name).is_file() for name in LONGEST_FIRST), LONGEST_FIRST
