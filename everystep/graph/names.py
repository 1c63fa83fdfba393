"""What a name in a function body stands for, read statically (never run).

``Names`` holds one function's scopes: its local ``def``s and lambdas, the
places each other local is assigned, its closure, its module's globals and
the builtins. ``resolve`` answers with the object an expression names the
way Python would look it up at run time, or ``MISSING``; an object of a
class known from a return annotation comes back as an ``Instance``, a list
of them as ``Elements`` (so ``handle.result()`` resolves when ``handle`` was
assigned from ``start(...)``). ``length`` says how many items iterating
over an expression gives, when the source says. The reader of a body
(``plan._Reader``) is a ``Names``.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any

#: What ``resolve`` answers for an expression it cannot read statically
#: (``None`` is an object a name may stand for).
MISSING = object()


@dataclass(frozen=True)
class _Instance:
    """An object of a class known statically (what a local holds)."""

    cls: type


@dataclass(frozen=True)
class _Elements:
    """A list (tuple, generator) of objects of one class known statically:
    ``[start(child, x) for x in xs]``; a loop over it gives ``_Instance``s."""

    cls: type


@dataclass(frozen=True, eq=False)
class _Origin:
    """Where a local gets a value: ``value`` itself, or (``element``) an
    item of iterating over it, the ``index``-th of a tuple target."""

    value: ast.AST
    element: bool = False
    index: int | None = None


#: Builtins that give back the elements of their one argument, in some order.
_SAME_ELEMENTS = (list, tuple, sorted, reversed)


def _same_elements(target: Any) -> bool:
    return any(target is builtin for builtin in _SAME_ELEMENTS)


def _same(one: Any, other: Any) -> bool:
    """The same object, or the same known class (never ``==`` on user objects)."""
    return one is other or (type(one) is type(other) and isinstance(one, (_Instance, _Elements)) and one == other)


def _elements(value: Any) -> Any:
    return value if isinstance(value, _Elements) else MISSING


def _elements_of(items: list[Any]) -> Any:
    """A collection's items, all objects of one known class: ``_Elements``."""
    if items and all(isinstance(item, _Instance) and item.cls is items[0].cls for item in items):
        return _Elements(items[0].cls)
    return MISSING


class Names:
    """The scopes of one function, and what its expressions name."""

    def __init__(self, fn: types.FunctionType, tree: ast.AST, outer_locals: dict[str, ast.AST] | None = None) -> None:
        self.globals = fn.__globals__
        self.closure: dict[str, Any] = {}
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[var] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
        self.local_defs: dict[str, ast.AST] = dict(outer_locals or {})
        self.assigned: set[str] = set()
        # Where each other local gets its values, one entry per place that
        # assigns it (None where that cannot be read statically): what it
        # holds is known when every entry agrees (a handle whose methods
        # wait, a list of them, the element of such a list in a loop).
        self.origins: dict[str, list[_Origin | None]] = {}
        self._resolving: set[tuple[str, str]] = set()
        self._scan_locals(tree)

    def _scan_locals(self, tree: ast.AST) -> None:
        """Local functions and lambdas by name; every other local assignment
        shadows a global of the same name, and is resolved only from what
        it is assigned (``origins``)."""
        args = getattr(tree, "args", None)
        if isinstance(args, ast.arguments):
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None:
                    self.assigned.add(arg.arg)
                    self.origins.setdefault(arg.arg, []).append(None)
        known: dict[int, _Origin] = {}  # by id() of the Name a value is stored in
        stores: list[ast.Name] = []
        for node in ast.walk(tree):
            if node is tree:
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.local_defs[node.name] = node
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.local_defs[target.id] = node.value
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.assigned.add(node.id)
                stores.append(node)
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    known[id(target)] = _Origin(node.value)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                known[id(node.target)] = _Origin(node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                known[id(node.target)] = _Origin(node.iter, element=True)
                if isinstance(node.target, ast.Tuple):  # for i, handle in enumerate(handles)
                    for index, item in enumerate(node.target.elts):
                        known[id(item)] = _Origin(node.iter, element=True, index=index)
        for name in stores:
            self.origins.setdefault(name.id, []).append(known.get(id(name)))
        self.assigned -= set(self.local_defs)

    def resolve(self, expr: ast.AST) -> Any:
        """The object an expression names, statically; ``MISSING`` if unknown.
        A local def or lambda comes back as its ``ast`` node; an object of a
        class known from a return annotation as an ``_Instance``, a list of
        them as ``_Elements``."""
        if isinstance(expr, ast.Name):
            if expr.id in self.local_defs:
                return self.local_defs[expr.id]
            if expr.id in self.assigned:
                return self._local(expr.id)
            for scope in (self.closure, self.globals, vars(builtins)):
                if expr.id in scope:
                    return scope[expr.id]
            return MISSING
        if isinstance(expr, ast.Await):
            return self.resolve(expr.value)
        if isinstance(expr, ast.Call):
            target = self.resolve(expr.func)
            if _same_elements(target) and len(expr.args) == 1:
                return _elements(self.resolve(expr.args[0]))  # list(handles), sorted(handles)
            return _returned(target)  # ``start(...).result()``
        if isinstance(expr, (ast.ListComp, ast.GeneratorExp)):
            return _elements_of([self.resolve(expr.elt)])
        if isinstance(expr, (ast.List, ast.Tuple)):
            return _elements_of([self.resolve(item) for item in expr.elts])
        if isinstance(expr, ast.Attribute):
            base = self.resolve(expr.value)
            if isinstance(base, _Instance):
                base = base.cls
            if isinstance(base, (types.ModuleType, type)):
                try:
                    return inspect.getattr_static(base, expr.attr)
                except AttributeError:
                    return MISSING
        return MISSING

    def _local(self, name: str) -> Any:
        """What a local holds, when every assignment of it says the same."""
        key = ("value", name)
        origins = self.origins.get(name)
        if not origins or key in self._resolving:
            return MISSING
        self._resolving.add(key)
        try:
            values = [self._origin_value(origin) if origin is not None else MISSING for origin in origins]
        finally:
            self._resolving.discard(key)
        first = values[0]
        return first if all(_same(value, first) for value in values) else MISSING

    def _origin_value(self, origin: _Origin) -> Any:
        if not origin.element:
            return self.resolve(origin.value)
        iterable = origin.value
        if origin.index is not None:
            # enumerate(x) gives (index, element); zip(a, b) one element of each.
            if not isinstance(iterable, ast.Call) or any(isinstance(arg, ast.Starred) for arg in iterable.args):
                return MISSING
            target = self.resolve(iterable.func)
            if target is enumerate and origin.index == 1 and iterable.args:
                iterable = iterable.args[0]
            elif target is zip and origin.index < len(iterable.args):
                iterable = iterable.args[origin.index]
            else:
                return MISSING
        collection = self.resolve(iterable)
        return _Instance(collection.cls) if isinstance(collection, _Elements) else MISSING

    def length(self, expr: ast.AST) -> int | None:
        """How many items iterating over ``expr`` gives, when the source says
        (a literal, ``range`` of constants, a comprehension over one, a local
        assigned once from one); None otherwise."""
        if isinstance(expr, (ast.List, ast.Tuple)):
            return None if any(isinstance(item, ast.Starred) for item in expr.elts) else len(expr.elts)
        if isinstance(expr, ast.Constant) and isinstance(expr.value, (str, bytes)):
            return len(expr.value)
        if isinstance(expr, (ast.ListComp, ast.GeneratorExp)) and len(expr.generators) == 1 \
                and not expr.generators[0].ifs:
            return self.length(expr.generators[0].iter)
        if isinstance(expr, ast.Name) and expr.id in self.assigned:
            origins = self.origins.get(expr.id) or []
            key = ("length", expr.id)
            if len(origins) != 1 or origins[0] is None or origins[0].element or key in self._resolving:
                return None
            self._resolving.add(key)
            try:
                return self.length(origins[0].value)
            finally:
                self._resolving.discard(key)
        if isinstance(expr, ast.Call) and expr.args and not any(isinstance(arg, ast.Starred) for arg in expr.args):
            target = self.resolve(expr.func)
            if target is range:
                bounds = [arg.value for arg in expr.args if isinstance(arg, ast.Constant) and type(arg.value) is int]
                try:
                    return len(range(*bounds)) if len(bounds) == len(expr.args) else None
                except (TypeError, ValueError):  # more than three, or a step of 0
                    return None
            if (_same_elements(target) or target is enumerate) and len(expr.args) == 1:
                return self.length(expr.args[0])
            if target is zip:
                lengths = [self.length(arg) for arg in expr.args]
                known = [length for length in lengths if length is not None]
                return min(known) if len(known) == len(lengths) else None
        return None


def _returned(target: Any) -> Any:
    """What calling ``target`` returns, when its return annotation names a
    class (an ``_Instance`` of it); ``MISSING`` otherwise."""
    target = getattr(target, "fn", target)  # a @step or @workflow: its function
    if not callable(target) or isinstance(target, type):
        return MISSING
    try:
        returned = typing.get_type_hints(target).get("return")
    except Exception:  # annotations that do not evaluate: unknown
        return MISSING
    return _Instance(returned) if isinstance(returned, type) else MISSING


__all__ = ["MISSING", "Names"]
