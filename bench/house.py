"""The house of hub/: rooms, floors, arrows between rooms, circles, module sizes and wide
functions, printed as one JSON object: the figures issue 41's closing note compares before
and after a refactor (``--root`` another checkout, e.g. a ``git worktree`` of an older commit).

It reads the source with the layout test's own readers (tests/test_layout.py), pointed at the
given root, so the figures are those the test enforces.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "tests"))

import test_layout as layout  # noqa: E402  (the layout test's readers, not a copy of them)


def _wide_functions(root: Path, limit: int = 5) -> int:
    """Functions taking more than ``limit`` arguments (self/cls not counted)."""
    wide = 0
    for path in (root / "hub").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                names = [n for n in names if n not in ("self", "cls")]
                wide += len(names) > limit
    return wide


def house(root: Path) -> dict[str, object]:
    layout.ROOT = root
    rooms = sorted(p.name for p in (root / "hub").iterdir()
                   if p.is_dir() and not p.name.startswith(("_", ".")))
    arrows: Counter[tuple[str, str]] = Counter()
    for path in (root / "hub").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        room = layout._room(path)
        for module, _ in layout._hub_imports(path):
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else "hub"
            if target != room and target in layout.RANK and room in layout.RANK:
                arrows[(room, target)] += 1
    circles = {room: layout._circles(layout._module_arrows(layout._room_modules(room)))
               for room in rooms}
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines())
             for p in (root / "hub").rglob("*.py") if "migrations" not in p.parts}
    upward = sum(1 for (a, b) in arrows if layout.RANK[b] >= layout.RANK[a])
    return {
        "rooms": len(rooms),
        "floors": len({layout.RANK[r] for r in rooms if r in layout.RANK}),
        "room_arrows": len(arrows),
        "upward_or_sideways_arrows": upward,
        "circles": {r: c for r, c in circles.items() if c},
        "modules": len(sizes),
        "modules_over_500_lines": {k: v for k, v in sorted(sizes.items()) if v > 500},
        "largest": sorted(sizes.items(), key=lambda kv: -kv[1])[:8],
        "functions_over_5_args": _wide_functions(root),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE,
                        help="checkout to read (default: this one)")
    print(json.dumps(house(parser.parse_args().root.resolve()), indent=1))


if __name__ == "__main__":
    main()
