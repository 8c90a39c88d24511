"""The package's shape, checked: import-linter's contracts (pyproject.toml), no import
cycle, a small package root, one gRPC stack used through its public API only."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "eventsrc"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("core/cpu/cpuset.py", "import trio", "eventsrc.core.cpu.cpuset -> trio"),
        ("state/views.py", "import eventsrc.log.store", "eventsrc.state.views -> eventsrc.log.store"),
        ("log/store.py", "import eventsrc.node.daemon", "eventsrc.log.store -> eventsrc.node.daemon"),
    ],
)
def test_a_contract_fails_when_a_module_imports_against_it(tmp_path: Path, module: str, line: str, broken: str) -> None:
    shutil.copytree(PACKAGE, tmp_path / "eventsrc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    target = tmp_path / "eventsrc" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert broken in done.stdout


def strongly_connected(graph: grimp.ImportGraph, modules: list[str]) -> list[list[str]]:
    """The import cycles among ``modules`` (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    inside = set(modules)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v) & inside):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return found


def test_no_import_cycle_type_checking_imports_included() -> None:
    graph = grimp.build_graph("eventsrc", exclude_type_checking_imports=False)
    modules = [m for m in graph.modules if m.startswith("eventsrc")]
    assert strongly_connected(graph, modules) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert strongly_connected(graph, ["p.a", "p.b", "p.c"]) == [["p.a", "p.b", "p.c"]]


def test_the_package_root_holds_at_most_six_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 6, modules


def python_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "gen" not in p.relative_to(PACKAGE).parts[:1]]


#: The one import of h2 allowed: rpc/limits.py sets how many closed streams h2 remembers per
#: connection (grpclib has no option for it), a setting, not HTTP/2 spoken by eventsrc.
H2_SETTING = ("eventsrc/rpc/limits.py", "h2.connection")


def test_no_module_speaks_http2_itself() -> None:
    """grpclib is the one gRPC stack: nothing imports h2, hpack or hyperframe directly, but
    the one setting of ``H2_SETTING``."""
    offenders = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            allowed = {H2_SETTING[1]} if path.as_posix().endswith(H2_SETTING[0]) else set()
            offenders += [
                f"{path}:{node.lineno}"
                for n in names
                if n.split(".")[0] in ("h2", "hpack", "hyperframe") and n not in allowed
            ]
    assert offenders == []


def grpclib_attribute_assignments(source: str) -> list[int]:
    """The lines of ``source`` that assign to an attribute of grpclib (or of anything imported from it)."""
    tree = ast.parse(source)
    grpclib_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            grpclib_names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("grpclib")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpclib"):
            grpclib_names |= {a.asname or a.name for a in node.names}
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if target is not root and isinstance(root, ast.Name) and root.id in grpclib_names:
                lines.append(node.lineno)
    return lines


def test_the_assignment_check_finds_one() -> None:
    source = (
        "import grpclib.client\nfrom grpclib import server\n"
        "grpclib.client.recv_message = len\nsetattr(server, 'x', 1)\n"
    )
    assert grpclib_attribute_assignments(source) == [3, 4]


def test_nothing_assigns_to_a_grpclib_attribute() -> None:
    offenders = [f"{p}:{line}" for p in python_files() for line in grpclib_attribute_assignments(p.read_text())]
    assert offenders == []
