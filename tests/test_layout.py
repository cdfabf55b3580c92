"""The code layout holds: arrows point one way, rooms are entered by their front door, and the
exporter on a GPU node never loads the hub's machinery.

These read the source with ``ast`` (what the code imports, not what a test happened to load),
so a new module that breaks the layout fails here whatever it does at run time.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: A package may import only packages of a lower rank (and itself). The service shows the
#: validation layer's findings, so it sits one step above it; usage answers from the
#: inventory and the report (validate) and the service show them, so it sits between.
RANK = {
    "common": 0,
    "store": 1, "kube": 1,
    "inventory": 2,
    "usage": 3,
    "validate": 4, "onboard": 4,
    "service": 5, "devstack": 5,
    "commands": 6, "cli": 6, "__main__": 7,
}
HEAVY = ("sqlalchemy", "alembic", "kubernetes", "jinja2")


def _hub_imports(path: Path) -> list[tuple[str, int]]:
    """(dotted module, line) of every ``hub`` import in a file, function-level ones included."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "hub":
                found += [(f"hub.{alias.name}", node.lineno) for alias in node.names]
            elif node.module.startswith("hub."):
                found += [(node.module, node.lineno)]
                found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("hub.")]
    return found


def _room(path: Path) -> str:
    parts = path.relative_to(ROOT / "hub").parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def test_every_hub_package_is_a_known_room_with_a_front_door():
    rooms = {p.name for p in (ROOT / "hub").iterdir()
             if p.is_dir() and not p.name.startswith(("_", "."))}
    assert rooms <= set(RANK), f"a new room needs a place in the layout: {rooms - set(RANK)}"
    for room in rooms - {"commands"}:
        doc = ast.get_docstring(ast.parse((ROOT / "hub" / room / "__init__.py").read_text()))
        assert doc, f"hub/{room}/__init__.py must say what the room is for"


def test_arrows_point_one_way_and_rooms_are_entered_by_their_front_door():
    wrong: list[str] = []
    for path in sorted((ROOT / "hub").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        room = _room(path)
        for module, line in _hub_imports(path):
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else "hub"
            if target in ("__version__", room) or target not in RANK:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {module}"
            if RANK[target] >= RANK[room]:
                wrong.append(f"{where} (upward or sideways)")
            elif len(parts) > 2 and parts[2].startswith("_"):
                wrong.append(f"{where} (a private module of another room)")
    assert not wrong, "\n".join(wrong)


def _room_modules(room: str) -> dict[str, Path]:
    """Dotted name -> file of every module of a room (its front door under the room's name)."""
    found: dict[str, Path] = {}
    for path in (ROOT / "hub" / room).rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _module_arrows(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which of ``modules`` each one imports, function-level and TYPE_CHECKING ones included:
    ``from hub.x import _y`` is an arrow to the module hub.x._y, not to hub.x's front door."""
    arrows: dict[str, set[str]] = {}
    for name, path in modules.items():
        to: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in modules:
                        to.add(f"{node.module}.{alias.name}")
                    elif node.module in modules:
                        to.add(node.module)
            elif isinstance(node, ast.Import):
                to |= {a.name for a in node.names if a.name in modules}
        arrows[name] = to - {name}
    return arrows


def _circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import one another, directly or round a ring (Tarjan's strongly
    connected components of more than one module)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(arrows[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            ring = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(ring) > 1:
                circles.append(sorted(ring))

    for v in sorted(arrows):
        if v not in order:
            visit(v)
    return circles


def test_the_circle_finder_finds_a_circle_through_a_function_level_import(tmp_path: Path):
    (tmp_path / "a.py").write_text("from hub.room import _b\n")
    (tmp_path / "b.py").write_text("def f():\n    from hub.room._c import x\n")
    (tmp_path / "c.py").write_text("from hub.room._a import y\n")
    (tmp_path / "d.py").write_text("from hub.room._a import y\n")
    modules = {f"hub.room._{n}": tmp_path / f"{n}.py" for n in "abcd"}
    assert _circles(_module_arrows(modules)) == [["hub.room._a", "hub.room._b", "hub.room._c"]]


#: circles known and not yet closed, each to be closed by its own change (strict: closing one
#: fails here until it leaves this list)
KNOWN_CIRCLES: dict[str, list[list[str]]] = {}


@pytest.mark.parametrize("room", sorted(RANK.keys() - {"cli", "__main__"}))
def test_no_two_modules_of_a_room_import_each_other(room: str):
    """Inside a room, too, the arrows point one way: a module that needs a neighbour's name
    and is needed by it is one module, or the name belongs lower (issue 41: the inventory's
    schema no longer reaches up to the reconcile tables or the sync's writer)."""
    circles = _circles(_module_arrows(_room_modules(room)))
    assert circles == KNOWN_CIRCLES.get(room, []), circles


def test_the_spoke_uses_only_the_shared_helpers():
    for path in sorted((ROOT / "spoke").rglob("*.py")):
        for module, line in _hub_imports(path):
            assert module in ("hub.__version__",) or module.startswith("hub.common"), (
                f"{path.relative_to(ROOT)}:{line} imports {module}")


@pytest.mark.parametrize("with_config", [False, True])
def test_the_exporter_loads_none_of_the_hub_machinery(tmp_path: Path, with_config: bool):
    """`gpufleet exporter` (with or without --config) starts without SQLAlchemy, Alembic,
    the Kubernetes client or Jinja2, in a fresh interpreter."""
    args = ["exporter", "--help"]
    if with_config:
        config = tmp_path / "exporter.yaml"
        config.write_text("backend: sim\nsim-gpus: 2\ninterval: 5s\n")
        args = ["exporter", "--config", str(config), "--help"]
    code = (
        "import json, sys\n"
        "from hub.cli import cli\n"
        f"cli.main({args!r}, prog_name='gpufleet', standalone_mode=False)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_the_exporter_on_a_gpu_node_loads_neither_charts_nor_fakes():
    """A GPU node runs nvml or amdsmi: the report's charts and the simulated backend's fakes
    stay unloaded (the exporter's hub.common is errors, durations and the HTTP base)."""
    code = (
        "import json, sys\n"
        "import spoke, spoke.cli\n"
        "from hub.cli import cli\n"
        "cli.main(['exporter', '--help'], prog_name='gpufleet', standalone_mode=False)\n"
        "print(json.dumps([m for m in ('hub.common._charts', 'spoke._sim', 'spoke._fakes')"
        " if m in sys.modules]))\n"
        "print(spoke.SimBackend.__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded, sim = proc.stdout.strip().splitlines()[-2:]
    assert json.loads(loaded) == []
    assert sim == "SimBackend"  # still there when asked for


def test_a_shared_config_file_with_other_commands_keys_still_works_for_the_exporter(
        tmp_path: Path):
    """Keys of other commands are valid in one shared file; unknown ones are still refused."""
    from click.testing import CliRunner

    from hub.cli import cli

    shared = tmp_path / "gpufleet.yaml"
    shared.write_text("backend: sim\ndb: sqlite:////tmp/x.db\n")
    ok = CliRunner().invoke(cli, ["exporter", "--config", str(shared), "--help"])
    assert ok.exit_code == 0, ok.output
    shared.write_text("backend: sim\nno-such-option: 1\n")
    bad = CliRunner().invoke(cli, ["exporter", "--config", str(shared), "--help"])
    assert bad.exit_code == 2
    assert "unknown option 'no-such-option'" in bad.output
