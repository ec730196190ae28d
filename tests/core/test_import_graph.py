"""The import graph, read from the source with ast (nothing is imported): the core never names a
domain or an adapter, and no two modules import each other.

Modules are every .py file of `pivot_envs/` and of the top-level folders pyproject.toml's
`[tool.setuptools] package-dir` maps into the `pivot_envs` namespace (`domains/` -> `pivot_envs.domains`, ...). An import at module level
(class bodies and `if TYPE_CHECKING:` blocks included: a type-only import still ties two modules'
definitions together) runs when the module is imported; an import inside a function runs later.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ("pivot_envs.domains", "pivot_envs.adapters")
# A CLI command that still imports a domain by name (inside the command): the CLI rewrite under
# way moves such commands behind an entry-point group (run and train already went to the
# adapters). Delete the entry when the module no longer needs it; no other core module may join.
KNOWN_PLUGIN_IMPORTS: set[str] = set()


def _folders(root: Path) -> dict[str, Path]:
    """Import name -> folder, as pyproject.toml's `[tool.setuptools] package-dir` maps them."""
    with open(root / "pyproject.toml", "rb") as file:
        mapped = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    return {"pivot_envs": root / "pivot_envs", **{name: root / folder for name, folder in mapped.items()}}


def _modules(folders: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> source file, for every module under the folders."""
    modules = {}
    for package, folder in folders.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path], deferred: bool) -> set[str]:
    """The modules of ours that `name` imports: at module level, plus inside functions when `deferred`."""

    def known(dotted: str) -> str | None:  # the longest module of ours that the dotted name is in
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in modules:
                return ".".join(parts[:end])
        return None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str | None] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import) and (deferred or not in_function):
            found.update(known(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (deferred or not in_function):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # `from package import module` imports that module; `from module import name` the module
            found.update(
                known(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules else known(base)
                for alias in node.names
            )
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return {module for module in found if module is not None and module != name}


def _graph(root: Path, deferred: bool) -> dict[str, set[str]]:
    modules = _modules(_folders(root))
    return {name: _imports(name, path, modules, deferred) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per group of modules that reach each other, as a path 'a -> b -> ... -> a'."""
    cycles, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        # depth-first from start; a path back to start is a cycle through it
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for target in sorted(graph.get(node, ())):
                if target == start:
                    cycles.append([*path, start])
                    done.update(path)
                    stack.clear()
                    break
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    return cycles


def _is_core(module: str, root: Path) -> bool:
    return not any(
        module == name or module.startswith(name + ".") for name in _folders(root) if name != "pivot_envs"
    )


def test_the_core_never_imports_a_domain_or_an_adapter() -> None:
    naming = {
        module: sorted(target for target in targets if target.startswith(PLUGINS))
        for module, targets in _graph(ROOT, deferred=True).items()
        if _is_core(module, ROOT)
    }
    offenders = {
        module: targets
        for module, targets in naming.items()
        if targets and module not in KNOWN_PLUGIN_IMPORTS
    }
    assert offenders == {}, "the core finds domains and adapters through entry points, never by name"


def test_no_two_modules_import_each_other_at_module_level() -> None:
    assert _cycles(_graph(ROOT, deferred=False)) == []


def test_the_core_has_no_import_cycle_even_through_imports_inside_functions() -> None:
    graph = {
        m: {t for t in ts if _is_core(t, ROOT)}
        for m, ts in _graph(ROOT, deferred=True).items()
        if _is_core(m, ROOT)
    }
    assert _cycles(graph) == []


def test_the_graph_finds_cycles_through_type_checking_imports_and_functions(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "pivot_envs.domains" = "domains" }\n'
    )
    core, domain = tmp_path / "pivot_envs", tmp_path / "domains" / "demo"
    core.mkdir()
    domain.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "reading.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pivot_envs.picking import Rule\n"
    )
    (core / "picking.py").write_text(
        "from . import reading\n\ndef later():\n    from pivot_envs.domains.demo import spec\n"
    )
    (tmp_path / "domains" / "__init__.py").write_text("")
    (domain / "__init__.py").write_text("")
    (domain / "spec.py").write_text("import pivot_envs.picking\n")
    assert _cycles(_graph(tmp_path, deferred=False)) == [
        ["pivot_envs.picking", "pivot_envs.reading", "pivot_envs.picking"]
    ]
    assert _graph(tmp_path, deferred=True)["pivot_envs.picking"] == {
        "pivot_envs.reading",
        "pivot_envs.domains.demo.spec",
    }
    assert not _is_core("pivot_envs.domains.demo.spec", tmp_path) and _is_core("pivot_envs.picking", tmp_path)
