"""Each package of ``recovery`` says what it exports: ``__all__`` is exactly the public names it
defines or imports (not its submodules), so a name added to or dropped from a package is a
decision that fails here until ``__all__`` says so. The shared helpers the other packages use
(``recovery.fsio``, ``recovery.pids``, ``recovery.tail``, ``recovery.checkpoint.layout``) are
public modules; a ``_private`` module is for ``recovery`` alone (``pyproject.toml``'s import
contract, checked by ``tests/unit/test_import_rules.py``)."""

from __future__ import annotations
import __future__

import importlib
import inspect

import pytest

PACKAGES = [
    "recovery",
    "recovery.checkpoint",
    "recovery.protocol",
    "recovery.supervision",
    "recovery.transfer",
    "recovery.wal",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_exactly_the_package_s_public_names(name: str) -> None:
    package = importlib.import_module(name)
    public = {
        attr
        for attr, value in vars(package).items()
        if not attr.startswith("_")
        and not inspect.ismodule(value)
        and not isinstance(value, __future__._Feature)  # `from __future__ import annotations`
    }
    exported = package.__all__
    assert len(exported) == len(set(exported)), f"{name}.__all__ names a name twice"
    assert set(exported) == public


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_is_importable(name: str) -> None:
    package = importlib.import_module(name)
    for attr in package.__all__:
        assert getattr(package, attr) is not None, f"{name}.{attr}"
