"""The shape of the package, checked by parsing every module (lazy imports inside functions count):

* dependency direction: no import arrow points up the layer stack

      core → data → models → engines → agent → {sft, rl, eval} → {analysis, viz, dryrun}

  A package may import its own layer and any layer below; the three stages never import each other
  (they share everything through the layers below). ``analysis`` reads what the stages wrote (reports,
  statistics across seeds, probes): nothing a run executes imports it.
* no import cycle, inside a package or across packages (type-only imports included);
* no module over :data:`MAX_LINES` lines;
* no branch on a server engine's name outside ``paravt/engines`` (its backend says what it does);
* one home per name: a module imports a paravt name only to use it (not for others to import it from
  there, nor for the import's side effect), and imports each name from the module that defines it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "paravt"
LAYER = {"core": 0, "data": 1, "models": 2, "engines": 3, "agent": 4, "sft": 5, "rl": 5, "eval": 5,
         "analysis": 6, "viz": 6, "dryrun": 6}
MAX_LINES = 400
#: Modules allowed over MAX_LINES, each at no more than the length given.
LONG: dict[str, int] = {}
#: The only second-hand names allowed, by the module that serves them ("*": every name it imports).
SERVED: dict[str, set[str]] = {
}


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A ``paravt`` package under ``tmp_path`` holding ``files`` ({path inside the package: source})."""
    for rel, src in files.items():
        (tmp_path / "paravt" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "paravt" / rel).write_text(src)
    return tmp_path / "paravt"


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


def _imports(path: Path, type_hints: bool = False):
    """(module, line) of every absolute import; those under ``if TYPE_CHECKING:`` with ``type_hints``."""
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if type_hints else _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno


def _modules(root: Path) -> dict[str, Path]:
    return {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in root.rglob("*.py")}


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
    pkg = _fake_package(tmp_path, {"core/x.py": "def f():\n    from paravt.agent.episode import run_episode\n",
                                   "rl/y.py": "import paravt.eval.driver\n",
                                   "eval/z.py": "from paravt.analysis.seeds import main\n"})
    assert violations(pkg) == ["paravt/core/x.py:2: core imports paravt.agent.episode",
                               "paravt/eval/z.py:1: eval imports paravt.analysis.seeds",
                               "paravt/rl/y.py:1: rl imports paravt.eval.driver"]


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Cycles in the module import graph (top-level, lazy and type-only imports alike), each as a module list."""
    mods = _modules(root)
    graph = {m: sorted({imp for imp, _ in _imports(p, type_hints=True) if imp in mods and imp != m})
             for m, p in mods.items()}
    for m, p in mods.items():  # "from paravt.x import y" where y is a module counts as importing paravt.x.y
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
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
    pkg = _fake_package(tmp_path, {"eval/a.py": "from paravt.eval.b import f\n",
                                   "eval/b.py": "def f():\n    from paravt.eval import a\n",
                                   "eval/c.py": "from paravt.eval.d import T\nclass S: ...\n",
                                   "eval/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from paravt.eval.c import S\nclass T: ...\n"})
    assert import_cycles(pkg) == [["paravt.eval.a", "paravt.eval.b", "paravt.eval.a"],
                                  ["paravt.eval.c", "paravt.eval.d", "paravt.eval.c"]]


def long_modules(root: Path = ROOT, limit: int = MAX_LINES, allowed: dict[str, int] = LONG) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        n = len(path.read_text().splitlines())
        if n > max(limit, allowed.get(rel, 0)):
            out.append(f"{rel}: {n} lines")
    return out


def test_no_module_is_over_the_line_limit():
    assert long_modules() == []


def test_the_length_check_catches_a_long_module(tmp_path):
    pkg = _fake_package(tmp_path, {"core/ok.py": "x = 1\n" * MAX_LINES, "core/long.py": "x = 1\n" * (MAX_LINES + 1)})
    assert long_modules(pkg) == [f"paravt/core/long.py: {MAX_LINES + 1} lines"]


def _names_used(tree: ast.AST) -> set[str]:
    """Every name the module reads, string annotations (``"Tool | None"``) included."""
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        notes = [node.annotation] if isinstance(node, (ast.arg, ast.AnnAssign)) else []
        notes += [node.returns] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        for c in (c for a in notes if a is not None for c in ast.walk(a)):
            if isinstance(c, ast.Constant) and isinstance(c.value, str):
                try:
                    used |= {n.id for n in ast.walk(ast.parse(c.value, mode="eval")) if isinstance(n, ast.Name)}
                except SyntaxError:
                    pass
    return used


def _bound_names(node: ast.AST) -> list[str]:
    """The paravt names an import binds (``import paravt.x`` binds ``paravt``)."""
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("paravt"):
        return [a.asname or a.name for a in node.names]
    if isinstance(node, ast.Import):
        return [(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("paravt")]
    return []


def _second_hand(tree: ast.Module) -> set[str]:
    """The names a module's top level imports and does not define itself."""
    defined, imported = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return imported - defined


def reexports(root: Path = ROOT, served: dict[str, set[str]] = SERVED) -> list[str]:
    """Imports that give a name a second home: a paravt name a module imports and never uses (there
    for others to import, or for the import's side effect), and a name imported from a module that
    only imports it itself. ``served`` lists the ones allowed."""
    mods = _modules(root)
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}
    rel = {m: str(p.relative_to(root.parent)) for m, p in mods.items()}
    bad = []
    for m, tree in sorted(trees.items()):
        allowed = served.get(rel[m], set())
        skip, used = _type_checking_only(tree), _names_used(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            unused = [n for n in _bound_names(node) if n not in used and "*" not in allowed and n not in allowed]
            bad += [f"{rel[m]}:{node.lineno}: imports {n} without using it" for n in unused]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in trees:
                owner = served.get(rel[node.module], set())
                second = _second_hand(trees[node.module]) - owner if "*" not in owner else set()
                bad += [f"{rel[m]}:{node.lineno}: imports {a.name} from {node.module}, which imports it"
                        for a in node.names if a.name in second and f"{node.module}.{a.name}" not in trees]
    return bad


def test_every_name_has_one_home():
    assert reexports() == []


def test_the_home_check_catches_a_reexport_and_its_callers(tmp_path):
    pkg = _fake_package(tmp_path, {
        "core/a.py": "class Thing: ...\n",
        "core/shim.py": '"""Names for others."""\nfrom paravt.core.a import Thing\n\n__all__ = ["Thing"]\n',
        "core/uses.py": 'from paravt.core.shim import Thing\n\n\ndef f() -> "Thing":\n    return Thing()\n',
        "core/hint.py": 'from paravt.core.a import Thing\n\n\ndef g(x: "Thing | None"): ...\n'})
    assert reexports(pkg, {}) == ["paravt/core/shim.py:2: imports Thing without using it",
                                  "paravt/core/uses.py:1: imports Thing from paravt.core.shim, which imports it"]
    assert reexports(pkg, {"paravt/core/shim.py": {"Thing"}}) == []


#: Engines whose behaviour callers must take from their EngineBackend, never from their name. (``hf`` and
#: ``openai`` are also eval's two ways to run a model, in this process or through a chat server.)
SERVER_ENGINES = ("sglang", "vllm", "hf_server", "remote")


def engine_branches(root: Path = ROOT) -> list[str]:
    """Comparisons with, and mapping keys of, a server engine's name outside ``paravt/engines``: an
    engine's behaviour lives in its backend (paravt.engines.registry), not in ``if engine == ...``."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if rel.parts[1] == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            keys = node.keys if isinstance(node, ast.Dict) else [c for c in ast.walk(node)] if isinstance(node, ast.Compare) else []
            if any(isinstance(k, ast.Constant) and k.value in SERVER_ENGINES for k in keys):
                bad.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    return bad


def test_no_engine_is_branched_on_by_name():
    assert engine_branches() == []


def test_the_engine_check_catches_a_branch_and_a_table(tmp_path):
    pkg = _fake_package(tmp_path, {"rl/x.py": "def f(r):\n    return r.engine == 'vllm'\n",
                                   "eval/y.py": "T = {'sglang': 1}\n",
                                   "engines/z.py": "K = {'vllm': 1}\n"})
    assert engine_branches(pkg) == ["paravt/eval/y.py:1: {'sglang': 1}", "paravt/rl/x.py:2: r.engine == 'vllm'"]
