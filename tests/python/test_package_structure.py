"""The layout of the Python package, read from the source with ast (no import, no compiled
library): no import circle, the library never imports the tools, no module over 400 lines,
and one module per op family under cutlass_ops/ops/, named after its kernels/<family> folder."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cutlass_ops"
MAX_LINES = 400
# ops modules with no kernels/ folder: FusedMLP's kernels are generated per model (JIT or
# ahead of time), not kept in kernels/.
OPS_WITHOUT_FOLDER = {"fused_mlp"}
# The command line: the one place outside tools/ that may import the tools.
ENTRY_POINTS = {"cutlass_ops.__main__"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _target(name: str):
    """The module `name` names in the package: itself, or (an attribute of a module) that module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str) -> set:
    """Every cutlass_ops module `name` imports, at module level or inside functions: `import
    cutlass_ops.x`, `from .x import y` (y too where it is a submodule), __import__ and
    importlib.import_module of a literal name, each with the packages on the way that `name` is
    not inside (those are being imported already when `name` runs)."""
    path = MODULES[name]
    package = name if _is_package(name) else name.rpartition(".")[0]
    inside = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            if ast.unparse(node.func) in ("__import__", "importlib.import_module", "import_module"):
                names = [node.args[0].value]
        for n in names:
            if n != "cutlass_ops" and not n.startswith("cutlass_ops."):
                continue
            parts = n.split(".")
            for i in range(1, len(parts) + 1):
                target = _target(".".join(parts[:i]))
                if target and target not in inside:
                    found.add(target)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def test_the_graph_sees_the_package():
    assert "cutlass_ops.ops" in GRAPH["cutlass_ops"]
    assert "cutlass_ops.tools.cli" in GRAPH["cutlass_ops.__main__"]


def test_no_import_circle():
    """Module-level and function-level imports alike: a circle that only a function-level import
    closes still ties the two modules together."""
    circles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_library_does_not_import_the_tools():
    offenders = {name: sorted(t for t in targets if t == "cutlass_ops.tools" or t.startswith("cutlass_ops.tools."))
                 for name, targets in GRAPH.items()
                 if not name.startswith("cutlass_ops.tools") and name not in ENTRY_POINTS}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"library modules importing the tools: {offenders}"


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def _op_folders() -> list:
    """kernels/<family>/ folders that register ops (a TORCH_LIBRARY block in one of their files)."""
    registers = re.compile(r"TORCH_LIBRARY(_FRAGMENT)?\s*\(")
    return sorted(d.name for d in (ROOT / "kernels").iterdir() if d.is_dir() and any(
        registers.search(f.read_text(errors="replace")) for f in d.iterdir() if f.is_file()))


def _family_modules() -> set:
    return {p.stem for p in (PACKAGE / "ops").glob("*.py") if not p.stem.startswith("_")}


def test_every_op_folder_has_its_ops_module():
    folders = _op_folders()
    assert "conv2d_fused" in folders and "giou" in folders, folders
    missing = [f for f in folders if f not in _family_modules()]
    assert not missing, f"kernels/<family> folders without cutlass_ops/ops/<family>.py: {missing}"


def test_every_ops_module_has_its_folder():
    folders = set(_op_folders())
    orphans = sorted(_family_modules() - folders - OPS_WITHOUT_FOLDER)
    assert not orphans, f"cutlass_ops/ops modules named after no kernels/ folder: {orphans}"


@pytest.mark.parametrize("module", sorted(_family_modules() | {"_common"}))
def test_ops_package_imports_every_module(module):
    """ops/__init__.py imports every family module, so `import cutlass_ops` registers every
    fake impl and autograd formula."""
    assert f"cutlass_ops.ops.{module}" in GRAPH["cutlass_ops.ops"]
