"""Doors from a layer to one above it, named by the package root: a layer asks for a function
by name (``provider("load_model_folder")``) and never imports the layer that defines it;
``smiexlm/__init__.py``, above every layer, says which module provides each name. So
``ExLMModel.from_pretrained`` stays a convenience while the network imports no folder code."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_PROVIDERS: dict[str, str] = {}


def provide(name: str, target: str) -> None:
    """``target`` (``"package.module:function"``) answers ``name``; imported on first use."""
    _PROVIDERS[name] = target


def provider(name: str) -> Callable[..., Any]:
    """The function that answers ``name``."""
    module, _, attribute = _PROVIDERS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
