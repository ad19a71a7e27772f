"""A module path that moved to another layer still imports for a release, warning once and
giving the very objects of its new home."""

from __future__ import annotations

import importlib
import sys

import pytest

from smiexlm.core.moved import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_path_warns_and_holds_the_new_modules_objects(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    target = importlib.import_module(new)
    public = [k for k in vars(target) if not k.startswith("_")]
    assert public and all(getattr(module, k) is getattr(target, k) for k in public)
    assert importlib.util.find_spec(new).origin != importlib.util.find_spec(old).origin


def test_a_name_that_never_was_still_fails_to_import():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("smiexlm.moleculenet.no_such_module")
