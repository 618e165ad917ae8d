"""Dependency direction: no import arrow points up the layer stack (checked by parsing every module).

    core → data → models → engines → agent → {sft, rl, eval} → viz

A package may import its own layer and any layer below; the three stages never import each other
(they share everything through the layers below). Lazy imports inside functions count too.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "paravt"
LAYER = {"core": 0, "data": 1, "models": 2, "engines": 3, "agent": 4, "sft": 5, "rl": 5, "eval": 5, "viz": 6}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (type hints, never imported at run time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno


def violations(root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        src = _package(".".join(rel.parts))
        if src not in LAYER:
            continue
        for mod, line in _imports(path):
            if not mod.startswith("paravt.") and mod != "paravt":
                continue
            dst = _package(mod)
            if dst not in LAYER or dst == src:
                continue
            if LAYER[dst] > LAYER[src] or (LAYER[dst] == LAYER[src] == 5):
                bad.append(f"{path.relative_to(root.parent)}:{line}: {src} imports {mod}")
    return bad


def test_every_package_has_a_layer():
    pkgs = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    pkgs |= {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    assert pkgs <= set(LAYER), f"give these a layer: {sorted(pkgs - set(LAYER))}"


def test_no_import_points_up():
    assert violations() == []


def test_the_check_catches_an_upward_import(tmp_path):
    pkg = tmp_path / "paravt"
    (pkg / "core").mkdir(parents=True)
    (pkg / "core" / "x.py").write_text("def f():\n    from paravt.agent.episode import run_episode\n")
    (pkg / "rl").mkdir()
    (pkg / "rl" / "y.py").write_text("import paravt.eval.driver\n")
    assert violations(pkg) == ["paravt/core/x.py:2: core imports paravt.agent.episode",
                               "paravt/rl/y.py:1: rl imports paravt.eval.driver"]


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Cycles in the module import graph (top-level and lazy imports alike), each as a module list."""
    mods = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in root.rglob("*.py")}
    graph = {m: sorted({imp for imp, _ in _imports(p) if imp in mods and imp != m}) for m, p in mods.items()}
    for m, p in mods.items():  # "from paravt.x import y" where y is a module counts as importing paravt.x.y
        tree = ast.parse(p.read_text(), str(p))
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) not in skip and isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                graph[m] += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
    cycles, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return cycles


def test_no_import_cycle_inside_or_across_packages():
    assert import_cycles() == []


def test_the_cycle_check_catches_a_cycle(tmp_path):
    pkg = tmp_path / "paravt"
    (pkg / "eval").mkdir(parents=True)
    (pkg / "eval" / "a.py").write_text("from paravt.eval.b import f\n")
    (pkg / "eval" / "b.py").write_text("def f():\n    from paravt.eval import a\n")
    assert import_cycles(pkg) == [["paravt.eval.a", "paravt.eval.b", "paravt.eval.a"]]
