"""Helpers for tests that read rendered manifests."""

from __future__ import annotations

from typing import Any


def all_keys(node: Any) -> set[str]:
    """Every mapping key anywhere in a parsed YAML document (to prove nothing was injected)."""
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in all_keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in all_keys(v)}
    return set()
