"""Load pieces of the pinned SGLang / vLLM releases on a CPU machine.

Schema modules that import cleanly (SGLang's ``sglang.api.v1.api_types`` and OpenAI protocol,
vLLM's chat protocol) are imported as they are. Two pieces sit in modules whose import chain
needs CUDA-only packages (torchvision built for CUDA, tvm_ffi, sgl_kernel): SGLang's
``BaseMultimodalProcessor.build_input_ids`` and the weight-update request structs of
``sglang.srt.managers.io_struct``. Their source is read from the installed wheel and executed
as written (functions verbatim; the structs with their base ``BaseReq`` -- an IPC
array-encoding base the HTTP layer converts from JSON objects -- replaced by a plain keyword
msgspec Struct). Nothing here is our own reading of the API.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

import msgspec


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} is not installed in this environment (bash scripts/setup_env.sh conformance)")
    return Path(list(spec.submodule_search_locations)[0])


def load_file_module(pkg: str, rel: str):
    path = package_dir(pkg) / rel
    spec = importlib.util.spec_from_file_location(f"_conformance_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _class_node(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"class {name} not found")


def load_method(pkg: str, rel: str, cls: str, method: str, namespace: dict[str, Any]):
    """One method of a class, compiled from the release's source as written."""
    path = package_dir(pkg) / rel
    src = path.read_text()
    node = next(n for n in _class_node(ast.parse(src), cls).body
                if isinstance(n, ast.FunctionDef) and n.name == method)
    code = textwrap.dedent(ast.get_source_segment(src, node))
    ns = dict(namespace)
    exec(compile(code, f"{path}:{cls}.{method}", "exec"), ns)  # noqa: S102 - the pinned release's own code
    return ns[method]


def load_function(pkg: str, rel: str, name: str, namespace: dict[str, Any]):
    """One module-level function, compiled from the release's source as written."""
    path = package_dir(pkg) / rel
    src = path.read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns = dict(namespace)
    exec(compile(ast.get_source_segment(src, node), f"{path}:{name}", "exec"), ns)  # noqa: S102 - the release's code
    return ns[name]


class _JsonBase(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    rid: Optional[str] = None


def load_structs(pkg: str, rel: str, names: list[str]) -> dict[str, type]:
    """Request structs from the release's source; unknown JSON keys are rejected."""
    path = package_dir(pkg) / rel
    src = path.read_text()
    tree = ast.parse(src)
    # msgspec resolves annotations in the class's module: give the classes a real module.
    mod = types.ModuleType(f"_conformance_{path.stem}_structs")
    sys.modules[mod.__name__] = mod
    mod.__dict__.update({"msgspec": msgspec, "Optional": Optional, "List": List, "Dict": Dict, "Any": Any,
                         "Union": Union, "Literal": Literal, "BaseReq": _JsonBase})
    for name in names:
        exec(compile("from __future__ import annotations\n" + ast.get_source_segment(src, _class_node(tree, name)),  # noqa: S102
                     f"{path}:{name}", "exec"), mod.__dict__)
    return {n: mod.__dict__[n] for n in names}
