"""The package's imports run one way: config -> data -> model -> train -> evaluation -> analysis ->
pipeline/cli. The demo's guest wing (``llava_norm_demo``: the synthetic world, tiny backbones,
warm-up, demo driver and report) sits beside the core and builds on it; the core never imports it.

Every ``import`` in every module is read from the source (function-level ones included), so a
lazy import cannot hide an upward edge or a cycle; and a lazy import of the package's own code
must say why in a comment on its line.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llava_norm.config import load_config
from llava_norm.layout import PROJECTOR_FILE
from llava_norm.provenance import fingerprint, write_record
from llava_norm.train.record import training_record

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llava_norm"
GUEST = ROOT / "llava_norm_demo"
# Longest prefix wins.
LAYERS = {
    "llava_norm.config_schema": 0, "llava_norm.config_checks": 0, "llava_norm.config": 0, "llava_norm.provenance": 0,
    "llava_norm.layout": 0, "llava_norm.stats": 0, "llava_norm.files": 0,
    "llava_norm.data": 1,
    "llava_norm.model": 2, "llava_norm.inference": 2, "llava_norm.saved_model": 2,
    "llava_norm": 2,  # the package root re-exports the model
    "llava_norm.train": 3, "llava_norm.plan": 3,  # the plan runs training's own freezing, and training prints it
    "llava_norm.evaluation": 4,
    "llava_norm.analysis": 5,
    "llava_norm.pipeline": 6, "llava_norm.reuse": 6, "llava_norm.sweep": 6, "llava_norm.cli": 6,
    "llava_norm.chain_cli": 6, "llava_norm.chain_launch": 6,
    "llava_norm_demo": 7,
}
NAMES = ["config", "data", "model", "train", "evaluation", "analysis", "pipeline/cli", "demo (guest wing)"]
OURS = ("llava_norm", "llava_norm_demo")


def sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *GUEST.rglob("*.py")])


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    raise AssertionError(f"{module}: no layer assigned; add it to LAYERS")


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported llava_norm module, line, lazy) for every import in the file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(OURS):
            # ``from llava_norm.x import y`` may name a submodule y: the edge goes to it if it is one.
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                target = candidate if (ROOT / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                    (ROOT / candidate.replace(".", "/") / "__init__.py").exists() else node.module
                found.append((target, node.lineno, id(node) not in top))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) not in top) for a in node.names if a.name.startswith(OURS)]
    return found


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    return {module_name(p): imports(p) for p in sources()}


def test_every_import_goes_down_or_sideways():
    upward = []
    for module, edges in graph().items():
        for target, line, _ in edges:
            if layer(target) > layer(module):
                upward.append(f"{module}:{line} ({NAMES[layer(module)]}) imports {target} ({NAMES[layer(target)]})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle():
    edges = {m: {t for t, _, _ in e if t != m} for m, e in graph().items()}
    for module, targets in edges.items():
        edges[module] = {t for t in targets if t in edges and t != "llava_norm"}  # the root re-export is not a cycle
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_a_lazy_import_of_our_own_code_says_why():
    """A function-level import of the package's own code carries ``# lazy: <why>`` on its line or
    on the comment line heading its block of imports."""
    silent = []
    for path in sources():
        lines = path.read_text().splitlines()
        for target, line, lazy in imports(path):
            if not lazy:
                continue
            above = line - 2
            while above >= 0 and lines[above].strip().startswith(("from ", "import ", ")")):
                above -= 1
            if "# lazy" not in lines[line - 1] and not lines[above].strip().startswith("# lazy"):
                silent.append(f"{module_name(path)}:{line} imports {target} inside a function, with no '# lazy: why'")
    assert not silent, "\n".join(silent)


def test_the_model_raises_no_config_error_and_the_analyses_need_no_trainer():
    edges = graph()
    assert "llava_norm.config" not in {t for t, _, _ in edges["llava_norm.model.lora"]}
    assert "llava_norm.train.trainer" not in {t for t, _, _ in edges["llava_norm.analysis.layers"]}


def test_the_core_never_names_the_guest_wing():
    """Not even in a string handed to importlib: the demo's subcommands come in through the
    ``llava_norm.commands`` entry point that the guest package declares in pyproject.toml."""
    naming = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
              for i, line in enumerate(p.read_text().splitlines(), 1) if "llava_norm_demo" in line]
    assert not naming, "the core names the guest wing:\n" + "\n".join(naming)


def printed_by_fresh_interpreter(code: str, env: dict | None = None) -> list[str]:
    """The lines ``code`` prints in a new interpreter: what it imports is what ``code`` does, not
    what this test process already holds."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_guest_subcommands_are_registered_and_the_core_loads_without_them():
    """``llava-norm`` lists the demo's subcommands, and importing the whole core pulls in no
    module of the guest wing (checked in a fresh interpreter)."""
    from llava_norm.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"make-tiny", "synth", "warmup", "demo", "train", "eval"} <= set(commands)
    core = [module_name(p) for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__main__.py"]
    code = ("import importlib, sys\n"
            f"for m in {core!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.startswith('llava_norm_demo')))")
    loaded = printed_by_fresh_interpreter(code)
    assert loaded == ["[]"], f"importing the core loaded guest modules: {loaded}"


HEAVY = ("torch", "transformers", "deepspeed", "datasets", "matplotlib")


def test_the_command_line_starts_without_the_heavy_libraries():
    """Building ``llava-norm``'s parser (so ``--help`` and every argument error) and importing the
    package load none of torch, transformers, DeepSpeed, datasets or matplotlib (a fresh
    interpreter); the model module loads them and registers the Auto classes."""
    code = ("import sys\nimport llava_norm\nfrom llava_norm.cli import build_parser\nbuild_parser()\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
            "import llava_norm.model\nfrom transformers.models.auto.configuration_auto import CONFIG_MAPPING\n"
            "print('llava_norm' in CONFIG_MAPPING)")
    loaded = printed_by_fresh_interpreter(code)
    assert loaded == ["[]", "True"], loaded


def test_a_subcommand_that_loads_no_model_leaves_transformers_unloaded_and_quiet():
    """``llava-norm table`` (as the pipeline's and the sweep's orchestrators) never imports
    transformers just to quiet it (a fresh interpreter); transformers, loaded later while the
    subcommand runs (or by a process it launches, through the environment), still logs errors
    only; the caller's environment is as it was once the subcommand returns."""
    code = ("import os, sys\nimport llava_norm.cli as cli\n"
            "def table(args):\n"
            "    print('transformers' in sys.modules, os.environ.get('TRANSFORMERS_VERBOSITY'))\n"
            "    from transformers.utils import logging\n"
            "    print(logging.get_verbosity() == logging.ERROR)\n"
            "cli._table = table\ncli.main(['table', 'any'])\n"
            "print('TRANSFORMERS_VERBOSITY' in os.environ)")
    printed = printed_by_fresh_interpreter(code, env={k: v for k, v in os.environ.items()
                                                     if k != "TRANSFORMERS_VERBOSITY"})
    assert printed == ["False error", "True", "False"], printed


@pytest.mark.parametrize("yaml,key", [
    ("model: {{vision_tower: x, llm: y}}\n", "train.output_dir"),
    # after the default train.report_to ([tensorboard]) is read: the names transformers knows are
    # the machine's check (config_checks), not load_config's
    ("model: {{vision_tower: x, llm: y}}\ndata: {{mixture: []}}\ntrain: {{output_dir: {tmp}/out}}\n", "data.mixture"),
])
def test_a_config_error_from_train_is_said_before_torch_loads(tmp_path, yaml, key):
    """``llava-norm train`` reads its config before the training stack loads, so a config error
    costs a fraction of a second, not the libraries' start-up (a fresh interpreter)."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.format(tmp=tmp_path))
    code = ("import sys\nfrom llava_norm.cli import main\n"
            f"try:\n    main(['train', {str(config)!r}])\nexcept SystemExit as stop:\n    print(stop.code)\n"
            "print(sorted(m for m in ('torch', 'transformers.integrations.integration_utils', 'deepspeed', 'datasets') "
            "if m in sys.modules))")
    said, loaded = printed_by_fresh_interpreter(code)
    assert said.startswith(f"config error: {config}: key '{key}'") and loaded == "[]", (said, loaded)


def test_a_reused_stage_is_decided_without_model_code(tmp_path, tiny_dir):
    """A rerun of the pipeline or of a sweep task decides that a finished training stage is reused
    without importing transformers' model code (a fresh interpreter), which costs over a second
    of start-up in a process that then launches nothing. The config leaves train.report_to at its
    default ([tensorboard]), whose check imports it: the check of a stage that will run
    (test_pipeline)."""
    from tinydata import write_dataset, write_stage1_config  # lazy: only this test writes data

    config = write_stage1_config(tmp_path / "stage1.yaml", tiny_dir, *write_dataset(tmp_path / "data", n=4))
    out = tmp_path / "out"
    # a finished stage's record and outputs, as a run leaves them
    record = training_record(load_config(config, [f"train.output_dir={out}"], check_paths=False), 1)
    (out / "model").mkdir(parents=True)
    (out / "model" / "model.safetensors").write_bytes(b"weights")
    (out / PROJECTOR_FILE).write_bytes(b"projector")
    record.complete, record.outputs = True, {"model": fingerprint(out / "model"), "projector": fingerprint(out / PROJECTOR_FILE)}
    write_record(out, record)
    code = ("import sys\nfrom pathlib import Path\nfrom llava_norm.reuse import stage_decision\n"
            f"print(stage_decision(Path({str(config)!r}), [], Path({str(out)!r}), 1, False).reuse)\n"
            "print(sorted(m for m in ('transformers.modeling_utils', 'transformers.integrations.integration_utils') "
            "if m in sys.modules))")
    reused, loaded = printed_by_fresh_interpreter(code)
    assert reused == "True" and loaded == "[]", (reused, loaded)
