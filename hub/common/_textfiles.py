"""Reading the files a user hands us (config, prices, tokens, scopes, Kubernetes JSON) so
that a hostile or broken one ends in one line, never a traceback, a hang or a blown heap.

* size first: a file over its limit is refused by ``stat`` before a byte is parsed (a 40 MB
  price file would keep pure-Python YAML busy for a minute);
* text: not UTF-8 is an :class:`InputError`, not a ``UnicodeDecodeError`` deep in a reload;
* YAML: aliases are followed only while the document, fully expanded, stays under
  ``MAX_YAML_NODES`` nodes (a 405-byte "billion laughs" file expands to 10^9 and every
  ``repr`` or walk of it would too), and a mapping naming a key twice is refused (the last
  one silently winning is how a price or a scope goes wrong unnoticed); a NUL byte or another
  character YAML forbids is one line too (PyYAML refuses it before parsing, as a
  ``ReaderError`` no caller expected: a reloaded tokens file with one made every request a 500);
* JSON: nesting deeper than ``MAX_JSON_DEPTH``, a number YAML/JSON reads as infinite
  (``1e400``), an integer beyond 64 bits and a NUL in any string are refused: each would
  otherwise fail later as an OverflowError, a RecursionError or a database error that
  prints the SQL.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hub.common._errors import InputError

#: the largest YAML file we read (config, prices, tokens, scopes): far above any real one
MAX_YAML_BYTES = 2 * 1024 * 1024
#: nodes a YAML document may expand to through its aliases
MAX_YAML_NODES = 100_000
#: the largest JSON file read (`kubectl get ... -o json` of a big cluster is tens of MB)
MAX_JSON_BYTES = 512 * 1024 * 1024
#: nesting of a JSON document (a Kubernetes object nests about a dozen deep)
MAX_JSON_DEPTH = 100
INT64 = 2 ** 63


def read_text(path: str | Path, what: str, *, max_bytes: int = MAX_YAML_BYTES) -> str:
    """The file as text; InputError (one line, naming ``what``) when it cannot be read, is
    larger than ``max_bytes`` or is not UTF-8."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise InputError(f"{what} is {size:,} bytes, more than the {max_bytes:,} "
                                 "a file of this kind may have")
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # grew while read, or a pipe
        raise InputError(f"{what} is more than the {max_bytes:,} bytes a file of this kind "
                         "may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what} is not a text (UTF-8) file") from None


def _loader() -> type:
    import yaml
    from yaml.composer import ComposerError
    from yaml.constructor import ConstructorError

    class BoundedLoader(yaml.SafeLoader):
        """SafeLoader that counts what aliases expand to and refuses duplicate keys."""

        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._sizes: dict[int, int] = {}

        def compose_node(self, parent: Any, index: Any) -> Any:
            node = super().compose_node(parent, index)
            assert node is not None, "PyYAML's compose_node always returns one (stubs: Optional)"
            size = self._sizes.get(id(node))
            if size is None:
                children = node.value if isinstance(node.value, list) else []
                size = 1
                for child in children:
                    for part in (child if isinstance(child, tuple) else (child,)):
                        size += self._sizes.get(id(part), 1)
                self._sizes[id(node)] = size
            if size > MAX_YAML_NODES:
                raise ComposerError(None, None, f"aliases expand to more than "
                                    f"{MAX_YAML_NODES:,} nodes", node.start_mark)
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in getattr(node, "value", []):
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # an unhashable key: the base class says so
                if duplicate:
                    raise ConstructorError(None, None, f"duplicate key {brief_repr(key)}",
                                           key_node.start_mark)
            return super().construct_mapping(node, deep)

    return BoundedLoader


_LOADER: type | None = None


def brief_repr(value: Any, limit: int = 60) -> str:
    """A value for a one-line message, cut: a whole nested value may be huge."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def parse_yaml(text: str, what: str) -> Any:
    """The YAML document in ``text``; InputError naming ``what``, the line and the problem."""
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _loader()
    try:  # the loader checks every character as it is made: a NUL fails here already
        loader = _LOADER(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{what} is not valid YAML{_reader_problem(exc, text)}") from None
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        reason = f" ({problem})" if problem and ("duplicate" in problem
                                                 or "aliases" in problem) else ""
        raise InputError(f"{what} is not valid YAML{where}{reason}") from None
    except RecursionError:
        raise InputError(f"{what} is not valid YAML (nested too deep)") from None
    finally:
        loader.dispose()


def _reader_problem(exc: Any, text: str) -> str:
    """PyYAML's reader's complaint in words: where and which character (no file text)."""
    character, position = getattr(exc, "character", None), getattr(exc, "position", None)
    where = f" at line {text.count(chr(10), 0, position) + 1}" \
        if isinstance(position, int) else ""
    if not isinstance(character, int):
        return f"{where} (a character YAML does not allow)"
    name = "a NUL byte" if character == 0 else f"the control character {character:#04x}"
    return f"{where} ({name})"


def load_yaml(path: str | Path, what: str, *, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """:func:`read_text` then :func:`parse_yaml`."""
    return parse_yaml(read_text(path, what, max_bytes=max_bytes), what)


def _bad_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _bad_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def parse_json(text: str, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document in ``text``, checked by :func:`check_document`."""
    try:
        doc = json.loads(text, parse_float=_bad_float, parse_constant=_bad_constant)
    except RecursionError:
        raise InputError(f"{what}: not valid JSON (nested more than {max_depth} deep)"
                         ) from None
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        reason = f"line {line}" if line is not None else str(exc)
        raise InputError(f"{what}: not valid JSON ({reason})") from None
    check_document(doc, what, max_depth=max_depth)
    return doc


def check_document(doc: Any, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse what no Kubernetes object holds and what would fail later, far from here:
    nesting deeper than ``max_depth``, a NUL in a key or string (PostgreSQL refuses it with
    an error that prints the SQL), a float that is not finite, an integer beyond 64 bits.
    Iterative, so a deep document cannot exhaust the stack here either."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise InputError(f"{what}: a string holds a NUL character "
                                 f"({brief_repr(value)})")
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -INT64 <= value < INT64:
                raise InputError(f"{what}: the integer {brief_repr(value)} is out of range "
                                 "(64 bits)")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InputError(f"{what}: the number {value} is out of range")
        elif isinstance(value, (list, tuple, dict)):
            if depth >= max_depth:
                raise InputError(f"{what}: nested more than {max_depth} deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    stack.append((key, depth))
                stack.append((item, depth + 1))


def refuse_nul(values: Any, what: str) -> None:
    """InputError when a string in ``values`` (a scalar, list or mapping) holds a NUL: no
    name has one, and the databases disagree on it (SQLite stores it, PostgreSQL refuses
    it with an error that prints the statement)."""
    check_document(values, what)
