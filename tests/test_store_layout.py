"""The store is one class composed of one mixin per concern
(``everystep/store/base/``): what a caller sees is ``Store``, whole.

A method defined in two concern modules would be settled silently by the
method resolution order, one copy dead; an abstract method left over would
make every backend uninstantiable. Both are caught here, not in production.
"""

from __future__ import annotations

import inspect

from everystep.store import Store, base
from everystep.store.base import StoreCore

CONCERNS = [cls for cls in Store.__mro__ if issubclass(cls, StoreCore) and cls not in (Store, StoreCore)]


def _own(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items()
            if not name.startswith("__") and (inspect.isfunction(value) or isinstance(value, (classmethod,
                                                                                            staticmethod)))}


def test_every_concern_is_a_module_of_its_own() -> None:
    modules = [cls.__module__ for cls in CONCERNS]
    assert len(modules) == len(set(modules)) >= 9
    assert all(module.startswith("everystep.store.base.") for module in modules)


def test_no_method_is_defined_by_two_concerns() -> None:
    seen: dict[str, str] = {}
    for cls in [*CONCERNS, StoreCore]:
        for name in _own(cls):
            assert name not in seen, f"{name} in both {seen[name]} and {cls.__name__}"
            seen[name] = cls.__name__


def test_only_the_backend_hooks_are_left_abstract() -> None:
    assert Store.__abstractmethods__ == {"_open", "_transaction", "accepts", "_caller_cursor", "_named_rows"}


def test_the_names_callers_import_from_base_are_still_there() -> None:
    for name in ("LOST", "MAX_UUID", "MIN_UUID", "ClaimState", "NewStep", "Notifications", "Row", "RunnerInfo",
                 "Store", "StepWrite", "id_prefix_range", "new_run_id", "utcnow"):
        assert hasattr(base, name), name
