"""The package's shape, checked: import-linter's contracts (pyproject.toml), no import
cycle, a small package root, no two modules of one name, one gRPC stack used through its
public API only."""

from __future__ import annotations

import ast
import re
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
        ("api/node.py", "import eventsrc.api.podresources", "eventsrc.api.node -> eventsrc.api.podresources"),
        # the package is the product: the tests' servers and the developers' benches stay out of it
        ("cli/bench.py", "import testbed.servers.containerd", "eventsrc.cli.bench -> testbed.servers.containerd"),
        ("bench/harness.py", "import testbed.benches.scale", "eventsrc.bench.harness -> testbed.benches.scale"),
    ],
)
def test_a_contract_fails_when_a_module_imports_against_it(tmp_path: Path, module: str, line: str, broken: str) -> None:
    for package in ("eventsrc", "testbed"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
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


def shared_names(package: Path) -> dict[str, list[str]]:
    """The file names two or more modules under ``package`` share (``__init__.py`` and the
    generated ``gen/`` aside), each with the modules that bear it."""
    where: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if path.name != "__init__.py" and relative.parts[0] != "gen":
            where.setdefault(path.name, []).append(str(relative))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_two_modules_share_a_name() -> None:
    """Each module is named for what it does, so a name (in a traceback, a log line, a search)
    points at one file: no two share a file name, in whatever folders they are."""
    assert shared_names(PACKAGE) == {}


def test_the_shared_name_check_finds_a_planted_one(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "eventsrc", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "eventsrc" / "cli" / "views.py").write_text("")
    (tmp_path / "eventsrc" / "gen" / "retainer.py").write_text("")
    assert shared_names(tmp_path / "eventsrc") == {"views.py": ["cli/views.py", "state/views.py"]}


def loggers_named_otherwise(package: Path) -> list[str]:
    """Modules whose logger is not ``get_logger(__name__)``: a log line's ``logger`` names the
    module that wrote it."""
    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "get_logger"
            if named and [getattr(a, "id", "") for a in node.args] != ["__name__"]:  # type: ignore[attr-defined]
                out.append(str(path.relative_to(package)))
    return out


def test_every_module_logs_under_its_own_name(tmp_path: Path) -> None:
    assert loggers_named_otherwise(PACKAGE) == []
    (tmp_path / "x.py").write_text('log = get_logger("eventsrc.elsewhere")\n')
    assert loggers_named_otherwise(tmp_path) == ["x.py"]


def test_no_module_speaks_http2_itself() -> None:
    """grpclib is the one gRPC stack: nothing imports h2, hpack or hyperframe directly."""
    offenders = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path}:{node.lineno}" for n in names if n.split(".")[0] in ("h2", "hpack", "hyperframe")]
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


#: The private names eventsrc reaches into elsewhere, each for a reason: the base of its own
#: event types, and argparse's type of an argument group (the standard library's, which
#: ``add_argument_group`` returns and documents).
FOREIGN_PRIVATE_ALLOWED = frozenset({"EventBase", "_ArgumentGroup"})


def own_private_names(sources: list[str]) -> set[str]:
    """The private names eventsrc defines: its functions, classes and variables, and the
    attributes it sets on ``self`` or ``cls``."""
    own: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
    return {n for n in own if n.startswith("_")}


def foreign_private_uses(source: str, own: set[str]) -> list[str]:
    """Where ``source`` reads or writes a private attribute (``x._name``, not a dunder) that is
    not one of eventsrc's own, or imports a private name: another library's internals."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("_") and not name.startswith("__") and name not in own | FOREIGN_PRIVATE_ALLOWED:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("eventsrc"):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_the_private_attribute_check_finds_a_planted_one() -> None:
    planted = (
        "import asyncio\nfrom grpclib.client import _Private\n"
        "class Mine:\n    def __init__(self):\n        self._mine = 1\n"
        "def f(loop, me):\n    loop._timer_handle_cancelled = print\n    return loop._timers, me._mine\n"
    )
    own = own_private_names([planted])
    assert foreign_private_uses(planted, own) == [
        "2: import _Private",
        "7: loop._timer_handle_cancelled",
        "8: loop._timers",
    ]


def test_no_private_attribute_of_another_library_is_read_or_written() -> None:
    """No private attribute of asyncio, trio-asyncio, grpclib, h2 (or any other library) is
    read or written anywhere in eventsrc."""
    files = python_files()
    sources = {p: p.read_text() for p in files}
    own = own_private_names(list(sources.values()))
    offenders = [f"{p}:{use}" for p, source in sources.items() for use in foreign_private_uses(source, own)]
    assert offenders == []


def test_the_adr_index_lists_every_adr() -> None:
    """docs/adr/README.md names every decision record, and nothing that is not one."""
    adrs = REPO / "docs" / "adr"
    listed = set(re.findall(r"\]\((\d{4}-[a-z0-9-]+\.md)\)", (adrs / "README.md").read_text()))
    assert listed == {p.name for p in adrs.glob("[0-9][0-9][0-9][0-9]-*.md")}


def test_the_readme_reads_in_one_sitting() -> None:
    """Issue 36: the README is under 300 lines of at most 100 characters; the rest is in docs/."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 300 and [n for n, line in enumerate(lines, 1) if len(line) > 100] == []
