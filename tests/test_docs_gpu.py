"""The GPU and bench figures in the README, held against the raw output in bench/results/ and the
code that computes them: the kit's recorded results, the trainer logs, the plan beside each."""

import ast
import json
import re
import sys
from pathlib import Path

from llava_norm.config import load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


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
    ratio = small["planned_activations_gib"] / small["planned_states_gib"]
    assert flat.count(f"activations are {ratio:.1f} times its") == 2, ratio
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
    compiled = next(r for r in steps if (r["attn"], r["compiled"], r["rows"]) == ("sdpa", True, "4x8x1029"))
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
    planned = gpu_step.planned_peak(vision, gpu_step.shipped(gpu_step.LLMS["llama-3.2-3b"]), tokens, "ln_textnorm_gwc",
                                    gpu_step.PAPER_TEXT_NORM["llama-3.2-3b"], 8, 1029 - tokens, False, accum=4) / 2**30
    under = 1 - compiled["peak_mem_gib"] / planned  # the compiled 3B step, which the README names apart
    sys.modules.pop("gpu_step", None)
    assert max(abs(o) for o in offs) <= 0.01, offs
    readme = " ".join(README.split())
    assert "and within 1% of the steps with gradient accumulation (3B eager; 7B compiled, with checkpointing)" in readme
    assert f"the compiled 3B step with accumulation peaked {round(100 * under)}% under its plan" in readme, under


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
    rate, between, seconds, losses, texts = {}, {}, {}, {}, {}
    for run, name in logs.items():
        texts[run] = (results / name).read_text()
        steps = _logged_steps(texts[run])
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
    gpu = {run: float(re.search(r"Self CUDA time total: ([\d.]+)s", texts[run]).group(1)) / 3
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
