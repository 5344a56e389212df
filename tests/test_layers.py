"""The package's imports run one way: config -> data -> model -> train -> evaluation -> analysis ->
pipeline/cli, with the demo's guest wing (demo, synth, warmup, tiny backbones) above them all.

Every ``import`` in every module is read from the source (function-level ones included), so a
lazy import cannot hide an upward edge or a cycle; and a lazy import of the package's own code
must say why in a comment on its line.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llava_norm"
# Longest prefix wins. The guest wing is the demo's: the core never imports it.
LAYERS = {
    "llava_norm.config_schema": 0, "llava_norm.config_checks": 0, "llava_norm.config": 0, "llava_norm.provenance": 0,
    "llava_norm.layout": 0,
    "llava_norm.data": 1,
    "llava_norm.model": 2, "llava_norm.inference": 2, "llava_norm": 2,  # the package root re-exports the model
    "llava_norm.train": 3,
    "llava_norm.evaluation": 4,
    "llava_norm.analysis": 5,
    "llava_norm.pipeline": 6, "llava_norm.cli": 6,
    "llava_norm.demo": 7, "llava_norm.demo_report": 7, "llava_norm.synth": 7, "llava_norm.warmup": 7,
    "llava_norm.model.tiny": 7,
}
NAMES = ["config", "data", "model", "train", "evaluation", "analysis", "pipeline/cli", "demo (guest wing)"]
# The command line registers the guest wing's subcommands (make-tiny, synth, warmup, demo) and so
# may reach up to it; no other core module may.
REACHES_GUEST_WING = {"llava_norm.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
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
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llava_norm"):
            # ``from llava_norm.x import y`` may name a submodule y: the edge goes to it if it is one.
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                target = candidate if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                    (PACKAGE.parent / candidate.replace(".", "/") / "__init__.py").exists() else node.module
                found.append((target, node.lineno, id(node) not in top))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) not in top) for a in node.names if a.name.startswith("llava_norm")]
    return found


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_import_goes_down_or_sideways():
    upward = []
    for module, edges in graph().items():
        for target, line, _ in edges:
            if layer(target) > layer(module) and not (module in REACHES_GUEST_WING and layer(target) == 7):
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
    for path in sorted(PACKAGE.rglob("*.py")):
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
