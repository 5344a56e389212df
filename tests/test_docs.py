"""The figures in the README and docs that the code can compute, held against the code.

Each figure is produced by the command its doc names; a change to the plan, the configs or the
FLOP model that moves a figure fails here until the doc says the new one.
"""

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
        assert max(peaks) - min(peaks) < 0.1 and "(the arms differ by under 0.1 GiB)" in line, (stage, peaks)


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
    names, and each break's test has such a row: the mark says the break is applied and caught.
    The row's checked clauses (after the mark, split at ";", up to "also") are no more than the
    breaks naming its test: the count, not each clause's match with a break, which only reading
    tests/breaks.py tells."""
    from breaks import BREAKS

    def test_of(node: str) -> str:  # a parametrised node's function, from the tests folder
        return re.sub(r"\[.*\]$", "", node.removeprefix("tests/"))

    rows = [line for line in (ROOT / "tests/README.md").read_text().splitlines() if line.startswith("| `")]
    named = {test_of(re.match(r"\| `([^`]+)`", row).group(1)): "**checked**" in row for row in rows}
    broken = {test_of(b.test) for b in BREAKS}
    # a row may name a whole module (its checked case is said in the row)
    assert [t for t, checked in named.items() if checked and not any(b == t or b.startswith(f"{t}::") for b in broken)] == []
    assert [b for b in broken if not named.get(b, named.get(b.split("::")[0]))] == []
    more_clauses_than_breaks = []
    for row in rows:
        if "**checked**" in row:
            test = test_of(re.match(r"\| `([^`]+)`", row).group(1))
            checked = re.split(r";\s*also\b", row.split("**checked**", 1)[1].rsplit("|", 1)[0])[0]
            breaks = [b for b in BREAKS if test_of(b.test) == test or test_of(b.test).startswith(f"{test}::")]
            if len([c for c in checked.split(";") if c.strip()]) > len(breaks):
                more_clauses_than_breaks.append(test)
    assert more_clauses_than_breaks == []


def test_every_test_a_tests_readme_row_names_exists():
    """Each test named in a row's first cell, not only its first (a row may name several), is a
    test function of that file: a renamed or removed test leaves no row naming it."""
    missing = []
    for row in (ROOT / "tests/README.md").read_text().splitlines():
        if not row.startswith("| `"):
            continue
        for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
            path, _, test = re.sub(r"\[.*\]$", "", name).partition("::")
            source = ROOT / "tests" / path
            if not source.is_file() or (test and not re.search(rf"^def {re.escape(test)}\(", source.read_text(), re.M)):
                missing.append(name)
    assert missing == []


def test_the_tests_readme_quotes_the_command_make_test_runs():
    makefile = (ROOT / "Makefile").read_text()
    jobs = re.search(r"^TEST_JOBS \?= (\d+)$", makefile, re.M).group(1)
    recipe = re.search(r"^test: .*\n\t\$\(PY\) -m (pytest .*)$", makefile, re.M).group(1).replace("$(TEST_JOBS)", jobs)
    assert f"`{recipe.replace(' -q', '')}`" in " ".join((ROOT / "tests/README.md").read_text().split())


def test_the_modules_scheduled_first_exist():
    from conftest import LONGEST_FIRST

    assert all((ROOT / "tests" / name).is_file() for name in LONGEST_FIRST), LONGEST_FIRST


def test_the_ablation_notes_figures_are_its_committed_tables():
    """docs/ablation.md's statements, from the tables and timings committed beside it."""
    import csv
    import statistics

    folder, text = ROOT / "docs/ablation", " ".join((ROOT / "docs/ablation.md").read_text().split())
    widths, pope_zero = [], None
    for name, arm, said in (("results_stats.csv", "rms_textnorm_gwc", "+{d:.1f} [+{lo:.1f}, +{hi:.1f}], p = {p:.3f}"),
                            ("avx2_results_stats.csv", "rms_textnorm", "+{d:.1f}, p = {p:.3f}")):
        rows = list(csv.DictReader((folder / name).open()))
        deltas = [r for r in rows if r["delta"]]
        outside = [r for r in deltas if not float(r["delta_low"]) <= 0 <= float(r["delta_high"])]
        assert len(deltas) == 72 and len(outside) == 1 and "Of 72 deltas (8 arms × 9 benchmarks), 71 have" in text
        (r,) = outside
        figures = said.format(d=float(r["delta"]), lo=float(r["delta_low"]), hi=float(r["delta_high"]),
                              p=float(r["p_value"]))
        assert (r["arm"], r["benchmark"]) == (arm, "ai2d") and f"`{arm}` on AI2D, {figures}" in text, figures
        widths.append(statistics.median(float(r["delta_high"]) - float(r["delta_low"]) for r in deltas))
        means = {b: [float(r["score"]) for r in rows if r["benchmark"] == b] for b in ("mmbench_en_dev", "pope", "ocrbench")}
        assert max(means["ocrbench"]) <= 0.9
        if name.startswith("avx2"):  # the AVX-512 run's counts, read first, stand beside these
            assert f"MMBench's mean over seeds is 0 for {means['mmbench_en_dev'].count(0.0)} of the 9 arms" in text
            assert pope_zero is not None and f"POPE's for {means['pope'].count(0.0)} (AVX-512: {pope_zero})" in text
        else:
            pope_zero = means["pope"].count(0.0)
            assert f"(AVX-512: {means['mmbench_en_dev'].count(0.0)})" in text
    assert f"about {0.05 * 72:.1f} of 72 intervals would exclude 0 by chance" in text
    assert f"({widths[0]:.1f} and {widths[1]:.1f})" in text
    runs = list(csv.DictReader((folder / "results.csv").open()))
    zero = {b: sum(float(r[b]) == 0 for r in runs) for b in ("mmbench_en_dev", "pope")}
    assert len(runs) == 27 and f"scores 0 in {zero['mmbench_en_dev']} of 27 runs, POPE in {zero['pope']} of 27" in text
    assert f"(at most {max(float(r['ocrbench']) for r in runs):.1f};" in text
    for name, said in (("timings.json", "**{total:.1f} minutes**, everything included: world {world:.0f} s, warm-up "
                        "{warm:.0f} s, 27 × stage 1 {s1:.0f} s, 27 × stage 2 {s2:.0f} s, 27 evaluations {ev:.0f} s, "
                        "table {table} s"), ("avx2_timings.json", "It took {total:.1f} minutes.")):
        timings = json.loads((folder / name).read_text())
        steps = timings["steps"]

        def seconds(matches) -> float:
            return sum(s["seconds"] for s in steps if matches(s["step"]))

        figures = said.format(total=timings["total_s"] / 60, world=seconds(lambda n: n == "synthetic world"),
                              warm=seconds(lambda n: n == "backbone warm-up"),
                              s1=seconds(lambda n: n.endswith(": stage 1")), s2=seconds(lambda n: n.endswith(": stage 2")),
                              ev=seconds(lambda n: n.endswith(": eval")), table=seconds(lambda n: n == "results table"))
        assert figures in text, figures
    # the README's copies of the two totals
    totals = [json.loads((folder / name).read_text())["total_s"] / 60 for name in ("timings.json", "avx2_timings.json")]
    assert f"it took {totals[0]:.1f} minutes, and {totals[1]:.1f} with torch's AVX2 kernels forced" in " ".join(README.split())


def test_the_readmes_gpu_kit_deadline_is_the_kits():
    deadline = re.search(r"^DEADLINE_S = (\d+)", (ROOT / "bench/gpu_kit.py").read_text(), re.M).group(1)
    assert f"each half under an overall deadline of {deadline} s on one H100" in " ".join(README.split())


def test_the_readmes_t_factors_are_the_stats_modules():
    from llava_norm.stats import t_quantile

    factors = [f"{t_quantile(0.975, seeds - 1):.2f}" for seeds in (2, 3, 5)]
    assert "its 95% factor is {}, against {} over 3 seeds and {} over 5".format(*factors) in " ".join(README.split())
