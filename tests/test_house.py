"""The shape of the house, checked on the source text (pure AST: nothing of the package is imported).

- No import cycle among our own modules (``rllib_dph.*``), counting the imports
  inside functions too, nor among our packages (``rllib_dph.<package>``).
- Every package has a layer (``LAYERS``) and imports only packages of the layers below it.
- No function or method longer than 60 lines including its docstring (config builder methods
  are allowed a 60-line body after their docstring: their docstrings document every field).
- Engine names are spelled in one place, ``rllib_dph/engines/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("rllib_dph",)
MAX_LINES = 60
#: Config builder methods (``AlgorithmConfig`` setters under ``rllib_dph/algorithms/``) whose
#: body after the docstring must be <= MAX_LINES; their docstrings document every field.
CONFIG_BUILDERS = ("training", "held_out")
ENGINE_NAMES = ("hf", "vllm")



def _source_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <node.module> import ...`` written in ``module``."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _ours(name: str, modules: set[str]) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of our modules (None if none)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _imports(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(our imported module, line) of every import in ``path``, module-level or in a function.

    ``from x import y`` where ``x.y`` is a module counts as importing ``x.y``; relative imports
    are resolved. The parent packages that Python initialises on the way (``x/__init__.py``) are
    not counted: they would put every package's ``__init__`` on a cycle with its own modules.
    """
    module, is_package = _module_name(path), path.name == "__init__.py"
    found = []
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, is_package, node)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found += [(target, node.lineno) for target in map(lambda n: _ours(n, modules), names) if target]
    return [(target, line) for target, line in found if target != module]


def _import_graph() -> dict[str, dict[str, str]]:
    """module → {imported module: "path:line" of the first such import}."""
    files = _source_files()
    modules = {_module_name(p) for p in files}
    graph: dict[str, dict[str, str]] = {m: {} for m in modules}
    for path in files:
        for target, line in _imports(path, modules):
            graph[_module_name(path)].setdefault(target, f"{path.relative_to(REPO)}:{line}")
    return graph


def _cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One shortest cycle through each module that lies on a cycle, deduplicated."""
    cycles = set()
    for start in sorted(graph):
        paths, seen = [[start]], {start}
        while paths:  # breadth first: the shortest way back to ``start``
            path = paths.pop(0)
            for nxt in sorted(graph[path[-1]]):
                if nxt == start:
                    i = path.index(min(path))
                    cycles.add(tuple(path[i:] + path[:i]))
                    paths = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append(path + [nxt])
    return [list(c) for c in sorted(cycles)]


def test_no_import_cycle():
    graph = _import_graph()
    offenders = []
    for cycle in _cycles(graph):
        where = ", ".join(graph[a][b] for a, b in zip(cycle, cycle[1:] + cycle[:1]))
        offenders.append(f"cycle: {' -> '.join(cycle + cycle[:1])} ({where})")
    assert not offenders, "import cycles among our modules (imports in functions count):\n" + "\n".join(offenders)


def _package(module: str) -> str:
    """The package a module belongs to for layering: ``rllib_dph.<first part>``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "rllib_dph" else parts[0]


def _package_graph() -> dict[str, dict[str, str]]:
    """package → {imported package: "path:line" of the first such import}, between packages only."""
    graph: dict[str, dict[str, str]] = {}
    for module, targets in _import_graph().items():
        graph.setdefault(_package(module), {})
        for target, where in targets.items():
            if _package(target) != _package(module):
                graph[_package(module)].setdefault(_package(target), where)
    return graph


def test_no_import_cycle_between_packages():
    """Packages point one way (e.g. ``engines`` loads ``models``' folders, so ``models`` must not
    import ``engines``), even where no single module closes a cycle."""
    graph = _package_graph()
    offenders = [" -> ".join(c + c[:1]) + " (" + ", ".join(graph[a][b] for a, b in zip(c, c[1:] + c[:1])) + ")"
                 for c in _cycles(graph)]
    assert not offenders, "import cycles among our packages:\n" + "\n".join(offenders)


#: The package's layers, bottom first. A package (``rllib_dph.<name>``, or a module at the root)
#: imports only packages of the layers below its own: no upward arrows, and none within a layer.
#: Every package has a place here; a new one goes where its imports put it.
LAYERS = (
    ("rllib_dph.columns", "rllib_dph.files", "rllib_dph.chat"),  # the shared vocabulary
    ("rllib_dph.envs", "rllib_dph.losses"),  # verifier envs; loss terms as pure tensor functions
    ("rllib_dph.models",),  # resolving model names; building the bundled models
    ("rllib_dph.policy",),  # the RL module, LoRA adapters, the full state under FSDP2
    ("rllib_dph.engines",),  # rollout engines (they serve the policy's LoRA adapters)
    ("rllib_dph.rollout",),  # the one rollout path, and the rows of a rollout batch
    ("rllib_dph.evaluation",),  # pass@k & co. over an env split
    ("rllib_dph.env_runners", "rllib_dph.learners"),  # sampling (with validation) and updates
    ("rllib_dph.algorithms",),  # the configs and algorithms: GRPO, DPH
    ("rllib_dph.cli",),  # the rllib command: experiments, preflight, memory, export
    ("rllib_dph",),  # the face: rllib_dph/__init__.py
)


def _arrows_not_down(graph: dict[str, dict[str, str]], layers) -> list[str]:
    """``"a (layer i) imports b (layer j >= i) at path:line"`` for each import of ``graph`` that does
    not point down ``layers``; packages without a layer are left to :func:`test_every_package_has_a_layer`."""
    layer = {package: i for i, names in enumerate(layers) for package in names}
    return [f"{source} (layer {layer[source]}) imports {target} (layer {layer[target]}) at {where}"
            for source, targets in sorted(graph.items()) for target, where in sorted(targets.items())
            if source in layer and target in layer and layer[target] >= layer[source]]


def test_every_package_has_a_layer():
    placed = [package for names in LAYERS for package in names]
    assert len(placed) == len(set(placed)), f"packages in more than one layer: {sorted(placed)}"
    missing = sorted(set(_package_graph()) - set(placed))
    assert not missing, f"packages without a place in LAYERS (put each where its imports put it): {missing}"


def test_imports_point_down_the_layers():
    offenders = _arrows_not_down(_package_graph(), LAYERS)
    assert not offenders, "imports that do not point down LAYERS (move the code to its layer):\n" + "\n".join(offenders)


def test_the_layer_check_finds_upward_and_sideways_arrows():
    graph = {"low": {"high": "low.py:3"}, "high": {"low": "high.py:1"}, "mid": {}}
    assert _arrows_not_down(graph, (("low",), ("mid",), ("high",))) == ["low (layer 0) imports high (layer 2) at low.py:3"]
    assert _arrows_not_down(graph, (("high",), ("mid",), ("low",))) == ["high (layer 0) imports low (layer 2) at high.py:1"]
    assert len(_arrows_not_down(graph, (("low", "high"), ("mid",)))) == 2
    assert _arrows_not_down({"low": {}, "high": {"low": "high.py:1"}}, (("low",), ("high",))) == []


def _functions(tree: ast.Module):
    """(qualified name, node, enclosing class or None) of every function and method."""
    stack = [(tree, "", None)]
    while stack:
        parent, prefix, owner = stack.pop()
        for node in ast.iter_child_nodes(parent):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + node.name, node, owner
                stack.append((node, f"{prefix}{node.name}.", None))
            elif isinstance(node, ast.ClassDef):
                stack.append((node, f"{prefix}{node.name}.", node))
            else:
                stack.append((node, prefix, owner))


def _length(node, config_builder: bool) -> int:
    """Lines from ``def`` to the end; for a config builder, of the body after its docstring."""
    body = node.body
    if config_builder and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return node.end_lineno - body[1].lineno + 1 if len(body) > 1 else 0
    return node.end_lineno - node.lineno + 1


def test_no_function_over_60_lines():
    offenders = []
    for path in _source_files():
        rel = path.relative_to(REPO)
        in_algorithms = rel.parts[:2] == ("rllib_dph", "algorithms")
        for name, node, owner in _functions(_parse(path)):
            builder = in_algorithms and owner is not None and node.name in CONFIG_BUILDERS
            lines = _length(node, builder)
            if lines > MAX_LINES:
                what = "body after the docstring" if builder else "lines"
                offenders.append(f"{rel}:{node.lineno} {name}: {lines} {what}")
    assert not offenders, f"functions over {MAX_LINES} lines; split them into named helpers:\n" + "\n".join(offenders)


def test_engine_names_live_in_engines():
    offenders = []
    for path in _source_files():
        rel = path.relative_to(REPO)
        if rel.parts[:2] == ("rllib_dph", "engines"):
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Constant) and node.value in ENGINE_NAMES:
                offenders.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not offenders, (
        "engine names spelled outside rllib_dph/engines/ (use its registry instead):\n" + "\n".join(offenders)
    )
