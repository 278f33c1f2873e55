"""Lazy package exports: a stage package names its public API in a table ``{name: module}`` and loads
a module only when one of its names is first used, so ``import clustertrain.<stage>`` costs nothing and a
command pays only for the libraries (torch, numpy, boto3, tokenizers) of what it calls.

    _PUBLIC = {"sync": "clustertrain.storage.syncing", ...}   # a dict literal: the import-graph test reads it
    __getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The module-level ``__getattr__``, ``__dir__`` and ``__all__`` of a lazy ``package``."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        import sys

        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__, sorted(table)
