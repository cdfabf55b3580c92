"""The rendering machinery shared by spoke, policy and hub-service manifests.

Plain functions, values in and ``{relative path: text}`` out; only :func:`write_tree` touches
the disk. The manifests live as Jinja2 templates in ``templates/`` and ``policies/`` at the
repository top (``hub/_bundled/...`` inside a wheel) so that reviewers read YAML, not Python.

Two rules keep the output safe to apply and to diff in a pull request:

* every user-supplied value goes through the ``q`` filter, which emits a quoted YAML scalar, so
  no value (a URL, an image reference) can add keys or documents to a manifest;
* output is a pure function of the values (sorted keys, no timestamps), so rendering twice gives
  byte-identical files and a re-render shows only real changes.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2
import yaml

from hub import __version__
from hub.common import InputError, template_roots

DEFAULT_EXPORTER_IMAGE = f"ghcr.io/gpufleet/gpufleet:{__version__}"
DEFAULT_NAMESPACE = "gpufleet"
MARKER = ".gpufleet-rendered"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
PLAIN_KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")


def _choice(value: str | None, choices: tuple[str, ...], what: str) -> str:
    text = (value or "").strip().lower()
    if not text:
        raise InputError(f"{what} is required: choose one of {', '.join(choices)}")
    if text not in choices:
        raise InputError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return text


def dns_label(value: str | None, what: str) -> str:
    text = value or ""
    if len(text) > 63 or not DNS_LABEL.match(text):
        raise InputError(
            f"{what} {text!r} is not a valid DNS-1123 label "
            "(lower-case letters, digits and '-', at most 63 characters)"
        )
    return text


def _dns_subdomain(value: str, what: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN.match(value):
        raise InputError(f"{what} {value!r} is not a valid DNS-1123 subdomain")
    return value


def _no_templates(value: str, what: str) -> str:
    # ACM would evaluate "{{ ... }}" inside a policy; no user value has a reason to hold one.
    if "{{" in value or "}}" in value:
        raise InputError(f"{what} must not contain '{{{{' or '}}}}' (ACM reads them as templates)")
    return value


def label_pair(text: str, what: str = "label") -> tuple[str, str]:
    """Parse and check ``KEY=VALUE`` with Kubernetes label syntax."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InputError(f"{what} {text!r} must be KEY=VALUE")
    prefix, slash, name = key.rpartition("/")
    ok = bool(LABEL_NAME.match(name)) and len(name) <= 63
    if slash:
        ok = ok and len(prefix) <= 253 and bool(DNS_SUBDOMAIN.match(prefix))
    if not ok:
        raise InputError(f"{what} key {key!r} is not a valid Kubernetes label key")
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise InputError(f"{what} value {value!r} is not a valid Kubernetes label value")
    return key, value


def _url(value: str | None) -> str:
    text = (value or "").strip()
    if not text:
        raise InputError("--remote-write-url is required in remote-write mode "
                         "(the hub's receive endpoint, e.g. https://receive.example.com/api/v1/receive)")
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise InputError("--remote-write-url must not contain spaces or control characters")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--remote-write-url {text!r} must be an http(s) URL with a host")
    if parts.username or parts.password:
        raise InputError("--remote-write-url must not carry credentials; "
                         "they belong in the remote-write Secret")
    return _no_templates(text, "--remote-write-url")


def _image(value: str | None, what: str) -> str:
    text = value or ""
    if not text.strip():
        raise InputError(f"{what} must not be empty")
    text = _no_templates(text, what)
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        # quoted, a newline could add no key, but no image name has one: it is a pasted
        # mistake (or a probe) that would fail only when the pod pulls
        raise InputError(f"{what} {text!r} is not an image reference (spaces or control "
                         "characters)")
    return text



# ---------------------------------------------------------------------------------------------
# Templates



def yaml_quote(value: Any) -> str:
    """A YAML scalar that always parses back to ``str(value)``: no value can add keys.

    Double-quoted as a rule; single-quoted when the text holds ``"`` but nothing that needs an
    escape, so ACM's ``{{hub fromSecret "ns" ...}}`` stays readable in the file.
    """
    text = str(value)
    if text.isprintable():
        if '"' not in text and "\\" not in text:
            return '"' + text + '"'
        if "'" not in text:
            return "'" + text + "'"
    dumped = yaml.safe_dump(text, default_style='"', width=1 << 30, allow_unicode=False)
    return dumped.removesuffix("\n...\n").rstrip("\n")


def yaml_mapping(mapping: Mapping[str, Any], indent: int) -> str:
    """Lines ``key: "value"`` at ``indent`` spaces, sorted, for labels and selectors."""
    pad = " " * indent
    lines = []
    for key in sorted(mapping):
        shown = key if PLAIN_KEY.match(key) else yaml_quote(key)
        lines.append(f"{pad}{shown}: {yaml_quote(mapping[key])}")
    return "\n".join(lines)


@cache
def _environment(templates: Path, policies: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PrefixLoader({
            "templates": jinja2.FileSystemLoader(str(templates)),
            "policies": jinja2.FileSystemLoader(str(policies)),
        }),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = yaml_quote
    env.filters["mapping"] = yaml_mapping
    return env


def _render(template: str, /, **context: Any) -> str:
    env = _environment(*template_roots())
    text = env.get_template(template).render(version=__version__, **context)
    return text.rstrip("\n") + "\n"


def _labels(name: str, component: str, instance: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "gpufleet",
        "app.kubernetes.io/managed-by": "gpufleet",
        "app.kubernetes.io/version": __version__,
    }


def _selector(name: str, instance: str) -> dict[str, str]:
    # Only labels that never change: a Deployment's selector is immutable.
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": instance}



def _kustomization(files: Iterable[str]) -> str:
    return _render("templates/common/kustomization.yaml.j2", resources=list(files))



# ---------------------------------------------------------------------------------------------
# Writing


def write_tree(files: Mapping[str, str], out: str | Path) -> Path:
    """Write ``files`` under directory ``out``, all or nothing.

    Everything is written into a temporary directory beside ``out`` first, so a failure never
    leaves half a set of manifests. A new ``out`` is that directory renamed into place. An
    existing one keeps its inode (a shell or editor inside it stays valid): its entries are
    swapped for the new ones by renames, undone if one fails. It is replaced only when empty or
    written by gpufleet (it holds the marker file); anything else is refused, never deleted.
    """
    try:
        # abspath, not resolve: "." gets a real name, and a symlinked --out stays a link.
        target = Path(os.path.abspath(out))
    except OSError:
        raise InputError("the current directory no longer exists") from None
    if target.exists() and not target.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    existing = target.is_dir()
    if existing and any(target.iterdir()) and not (target / MARKER).is_file():
        raise InputError(f"--out {out} is not empty and was not written by gpufleet: "
                         "choose a new or empty directory")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise InputError(f"cannot write to {parent}: {exc.strerror}") from None
    try:
        for rel, text in sorted(files.items()):
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        (staging / MARKER).write_text(
            "Rendered by gpufleet. Re-rendering replaces every file in this directory.\n")
        if existing:
            _swap_entries(target, staging)
        else:
            staging.chmod(0o755)
            os.rename(staging, target)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _swap_entries(target: Path, staging: Path) -> None:
    """Replace target's entries with staging's by renames; on failure put the old ones back."""
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    moved_out: list[str] = []
    moved_in: list[str] = []
    try:
        for entry in sorted(target.iterdir()):
            os.rename(entry, old / entry.name)
            moved_out.append(entry.name)
        for entry in sorted(staging.iterdir()):
            os.rename(entry, target / entry.name)
            moved_in.append(entry.name)
    except OSError:
        for name in moved_in:
            os.rename(target / name, staging / name)
        for name in moved_out:
            os.rename(old / name, target / name)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
