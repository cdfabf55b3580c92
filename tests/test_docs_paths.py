"""Every module the docs and docstrings point a reader to exists: a `hub/...` or `spoke/...`
path in docs/*.md, README.md, the templates or a docstring or comment of hub/, spoke/ and
bench/, and every dotted ``hub.x.y`` name in a docstring or comment, in the templates and in
the docs' inline code (a template's comment lands in every rendered manifest). A rename that
leaves them behind sends readers to modules that are gone. A source file the docs name
without its folder (`_ledger.py`) must be the one file of that name in the repository: a
name that is gone, or that several folders hold (`__init__.py`, `cli.py`), leaves the reader
to guess."""

from __future__ import annotations

import ast
import importlib
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w./-])((?:hub|spoke)/[\w./-]*\w)")
DOTTED = re.compile(r"(?<![\w./-])((?:hub|spoke)(?:\.[A-Za-z_]\w*)+)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
#: the wheel's layout (pyproject force-include), not a source path
WHEEL_ONLY = ("hub/_bundled",)
#: a source file named without its folder: `_vendors.py`, `deployment.yaml.j2`, `run.sh`
BARE = re.compile(r"(?<![\w./-])(\w[\w.-]*\.(?:py|j2|sh))\b(?![\w/-])")
#: folders of the working tree that are no part of the repository's sources
NOT_SOURCES = frozenset({"__pycache__", "shared", "node_modules", "build", "dist"})


def docs() -> list[Path]:
    return [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]


def sources() -> list[Path]:
    return sorted(p for top in ("hub", "spoke", "bench") for p in (REPO / top).rglob("*.py"))


def templates() -> Iterator[tuple[Path, int, str]]:
    """(template, line, text) of every line of the manifest templates."""
    for path in sorted((REPO / "templates").rglob("*.j2")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            yield path, n, line


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of a Python file's docstrings and comments."""
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                for i, line in enumerate(body[0].value.value.splitlines()):
                    yield body[0].lineno + i, line
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def path_exists(name: str) -> bool:
    """A source path, or a file gpufleet renders under that name (``spoke/namespace.yaml``
    in a rendered tree is templates/.../namespace.yaml.j2)."""
    name = name.rstrip(".")
    if (REPO / name).exists() or name.startswith(WHEEL_ONLY):
        return True
    rendered = Path(name).name
    return rendered.endswith(".yaml") and any((REPO / "templates").rglob(rendered + ".j2"))


def files_named() -> dict[str, list[str]]:
    """Every file of the repository by its bare name (dot-folders, caches and working
    folders left out)."""
    found: dict[str, list[str]] = {}
    for top, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in NOT_SOURCES
                   and not d.endswith(".egg-info")]
        for name in names:
            found.setdefault(name, []).append(str((Path(top) / name).relative_to(REPO)))
    return found


def bare_misses(line: str, known: dict[str, list[str]]) -> list[str]:
    """The bare file names in ``line`` that are not exactly one file, each with what it is."""
    misses = []
    for name in BARE.findall(line):
        held = sorted(known.get(name, []))
        if len(held) != 1:
            where = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            misses.append(f"{name} ({where or 'no such file'})")
    return misses


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_hub_and_spoke_path_named_exists():
    missing = []
    for doc in docs():
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            missing += [f"{doc.relative_to(REPO)}:{n}: {m}" for m in PATH.findall(line)
                        if not path_exists(m)]
    for src in sources():
        for n, line in prose(src):
            missing += [f"{src.relative_to(REPO)}:{n}: {m}" for m in PATH.findall(line)
                        if not path_exists(m)]
    for tpl, n, line in templates():
        missing += [f"{tpl.relative_to(REPO)}:{n}: {m}" for m in PATH.findall(line)
                    if not path_exists(m)]
    assert not missing, "\n".join(missing)


def test_every_dotted_module_named_in_docstrings_and_inline_code_exists():
    missing = []
    for src in sources():
        for n, line in prose(src):
            missing += [f"{src.relative_to(REPO)}:{n}: {m}" for m in DOTTED.findall(line)
                        if not resolves(m)]
    for doc in docs():
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for code in INLINE_CODE.findall(line):
                missing += [f"{doc.relative_to(REPO)}:{n}: {m}" for m in DOTTED.findall(code)
                            if not resolves(m)]
    for tpl, n, line in templates():
        missing += [f"{tpl.relative_to(REPO)}:{n}: {m}" for m in DOTTED.findall(line)
                    if not resolves(m.rstrip("()"))]
    assert not missing, "\n".join(missing)


def test_every_bare_file_name_in_the_docs_is_one_file_of_the_repository():
    known = files_named()
    missing = [f"{doc.relative_to(REPO)}:{n}: {miss}" for doc in docs()
               for n, line in enumerate(doc.read_text().splitlines(), 1)
               for miss in bare_misses(line, known)]
    assert not missing, "give each its folder:\n" + "\n".join(missing)


def test_the_checks_catch_a_stale_name():
    assert not path_exists("hub/vendors.py") and path_exists("hub/store/_profiles.py")
    assert path_exists("spoke/namespace.yaml")  # a rendered file, not a source path
    assert not resolves("hub.checks") and resolves("hub.validate._checks")
    known = files_named()
    assert bare_misses("`_ledger.py` writes, `_fold.py` folds", known) == []
    assert bare_misses("the fields live in `_vendors.py`", known) == [
        "_vendors.py (no such file)"]
    [twice] = bare_misses("the click layer in `cli.py`", known)
    assert twice.startswith("cli.py (") and "hub/cli.py" in twice and "spoke/cli.py" in twice
    # a path is the other check's: a bare name is one without its folder
    assert bare_misses("see hub/store/_vendors.py and docs/x.md", known) == []


#: top-level folders a doc may point a reader to: the repository's own (shared/ is a working
#: folder beside some checkouts, not part of the repository)
OUTSIDE = re.compile(r"(?<![\w./-])(shared/[\w./-]*\w|/work/[\w./-]*|\.\./[\w./-]*)")


def test_the_docs_point_to_no_file_outside_the_repository():
    found = [f"{doc.name}:{n}: {m.group()}" for doc in docs()
             for n, line in enumerate(doc.read_text().splitlines(), 1)
             for m in OUTSIDE.finditer(line)]
    assert found == [], found


def test_the_docs_checkov_line_is_the_one_the_suite_runs_offline():
    text = (REPO / "docs" / "onboarding.md").read_text()
    [line] = [m.group(1) for m in INLINE_CODE.finditer(text)
              if m.group(1).startswith("checkov -d ")]
    assert "--skip-download" in line and "--config-file .checkov.yaml" in line
