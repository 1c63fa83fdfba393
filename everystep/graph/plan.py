"""What a workflow body will do, read from its source (``ast``), never run.

``analyse(workflow)`` parses the body and returns a ``Plan``: the step calls
and ``parallel`` forks in the order the body makes them, inside the control
flow that decides whether they happen (loops, if/else, try/except, early
returns). Only constructs that contain a step or a fork are kept, so a body
of plain code between steps reads as the list of its steps.

What counts as a step is decided by resolving each call's target the way
Python would at run time, without running anything: a name looked up in the
function's locals (nested ``def`` and ``lambda``), closure, module globals
and builtins, an attribute looked up statically on a module or class
(``names.Names``). A target that is a ``@step`` is a step;
``everystep.parallel`` is a fork whose branches are read from its arguments
(lambdas, functions, lists of them for sequence branches), and so is
``everystep.gather`` (whose branches may also be step calls awaited in their
branch); an async body reads the same, an ``await`` being the expression it
awaits; a ``@workflow`` or a plain function of the user's code is read in
place, since the steps it calls are recorded in the same scope.

Waits are read the same way: ``waits()`` is the one table of engine calls
that make a run wait (a durable sleep, a message, a child's result), each
with the kind of wait it is and the step name its record carries. A call
that resolves to one of them is a ``Wait`` node: it takes a position like a
step, and the console draws it as a wait with its wake time, never as a
step of the user's. ``patched(id)`` is a ``Patch`` node: its answer is
recorded once per run and takes no position.

A method of an object is resolved when the object's class is known from
the source: a local assigned from a call whose return annotation names a
class (``handle = start(...)``), a list of those (``[start(...) for x in
xs]``, ``[start(a), start(b)]``) and the loop variable over such a list
(``for handle in handles``, ``enumerate``/``zip`` of one included). A
loop's ``count`` is how many items its iterable has when the source says
(a literal, ``range`` of constants, a comprehension over one), so the graph
knows when a fan-out is complete.

Limits, reported rather than guessed at: a call through a variable or a
method whose object cannot be resolved (``self.charge()``) is left out; a
fork whose branches are built at run time (``parallel(*jobs)``) is marked
dynamic and drawn from what was recorded. ``Plan.reason`` says why a body
could not be read at all (no source, a lambda, a syntax error), in which
case the caller falls back to the recorded steps alone.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import types
from dataclasses import dataclass
from typing import Any

from .names import Names
from .nodes import Arm, Choice, Exit, Fork, Loop, Node, Patch, Plan, StepCall, Try, Wait

import everystep

from .. import api, patches, wait_kinds
from ..api import StepFunction, WorkflowFunction
from ..body_rules import BodyRule, Declaration, declaration_of

MAX_INLINE_DEPTH = 6
MAX_NODES = 2000
MAX_TEXT = 60


@dataclass(frozen=True)
class WaitKind:
    """What an engine call that waits is, for the graph."""

    kind: str  # what the run waits for: "sleep", or a wait kind's name (``everystep.wait_kinds``)
    record: str  # the step name its record carries, e.g. ``everystep.sleep``


def _declared() -> list[tuple[Any, Declaration]]:
    """Every public call of ``everystep`` a body makes that records steps
    (the methods of its public types too: a child handle's ``result``),
    with its declaration (``everystep.body_rules``)."""
    found = []
    for name in everystep.__all__:
        obj = getattr(everystep, name)
        for candidate in [obj, *vars(obj).values()] if isinstance(obj, type) else [obj]:
            declared = declaration_of(candidate)
            if declared is not None and declared.records:
                found.append((candidate, declared))
    return found


@functools.cache
def waits() -> dict[Any, WaitKind]:
    """Every engine call that makes a run wait, by the object a body calls.

    Each wait is recorded as a step row (with its wake time, if any) and
    takes a position in its scope like a step, so the graph must know every
    one of them: a call missing here would be read as nothing and the steps
    after it numbered one short. Read from the calls' declarations: a wait
    that records one step, of a declared wait kind or a sleep. A method of
    a handle (a child run's ``result``) is keyed by the function found on
    its class: the reader resolves ``handle.result()`` when ``handle`` was
    assigned once from a call whose return annotation names that class, and
    ``start(...).result()`` likewise."""
    out = {}
    for call, declared in _declared():
        if declared.rule != BodyRule.WAIT or len(declared.records) != 1:
            continue
        record = declared.records[0]
        kind = wait_kinds.by_step.get(record)
        out[call] = WaitKind(kind.name if kind is not None else "sleep", record)
    return out


@functools.cache
def engine_steps() -> dict[Any, tuple[str, ...]]:
    """Engine calls that record steps of their own, by the object a body
    calls: the record names they write, in order (``call`` is a child's
    start and then the wait for its end), from their declarations. Like
    ``waits``, a call missing here would number the steps after it one
    short."""
    waiting = waits()
    return {call: declared.records for call, declared in _declared() if call not in waiting}


def wait_records() -> dict[str, WaitKind]:
    """The same table by the step name a wait's record carries."""
    return {row.record: row for row in waits().values()}


def analyse(workflow: Any) -> Plan:
    """The plan of a ``@workflow`` (or of a plain function used as one)."""
    fn = getattr(workflow, "fn", workflow)
    name = str(getattr(workflow, "name", None) or getattr(fn, "__qualname__", repr(fn)))
    if not isinstance(fn, types.FunctionType):
        return Plan(name, None, f"{type(fn).__name__} is not a Python function")
    if fn.__name__ == "<lambda>":
        return Plan(name, None, "the workflow is a lambda: there is no body to read")
    parsed = _parse(fn)
    if isinstance(parsed, str):
        return Plan(name, None, parsed)
    tree, offset = parsed
    reader = _Reader(fn, tree, offset, depth=0, active={fn.__code__})
    nodes = reader.body(tree.body)
    file = inspect.getsourcefile(fn)
    return Plan(name, tuple(nodes), None, tuple(dict.fromkeys(reader.notes)), file, fn.__code__.co_firstlineno)


def _parse(fn: types.FunctionType) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, int] | str:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        return f"the source of {fn.__qualname__} is not available ({exc})"
    try:
        module = ast.parse(source)
    except SyntaxError as exc:
        return f"the source of {fn.__qualname__} does not parse ({exc.msg})"
    for statement in module.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(statement):
                node._es_source = source  # type: ignore[attr-defined]  # for _text
            return statement, fn.__code__.co_firstlineno - 1
    return f"no function definition found in the source of {fn.__qualname__}"


def _text(node: ast.AST) -> str:
    """The expression as written (as unparsed when that is not available)."""
    text = None
    source = getattr(node, "_es_source", None)
    if source is not None:
        text = ast.get_source_segment(source, node)
    if text is None:
        try:
            text = ast.unparse(node)
        except Exception:  # unparse of odd trees: show something rather than fail
            text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _user_function(obj: Any) -> bool:
    """A plain function worth reading in place: user code, not a library's."""
    if not isinstance(obj, types.FunctionType) or obj.__name__ == "<lambda>":
        return False
    module = (getattr(obj, "__module__", None) or "").split(".")[0]
    return module not in sys.stdlib_module_names and module not in ("everystep", "supervisor")


class _Reader(Names):
    """Reads one function body (and, through ``inline``, what it calls)."""

    def __init__(self, fn: types.FunctionType, tree: ast.AST, offset: int, depth: int,
                 active: set[types.CodeType], notes: list[str] | None = None,
                 outer_locals: dict[str, ast.AST] | None = None) -> None:
        super().__init__(fn, tree, outer_locals)
        self.fn = fn
        self.offset = offset
        self.depth = depth
        self.active = active
        self.notes = notes if notes is not None else []
        self.count = 0

    def line(self, node: ast.AST) -> int | None:
        lineno = getattr(node, "lineno", None)
        return lineno + self.offset if lineno is not None and self.depth == 0 else None

    def _budget(self) -> bool:
        self.count += 1
        if self.count > MAX_NODES:
            self.notes.append(f"the body has more than {MAX_NODES} step calls; the rest is not drawn")
            return False
        return True

    # -- statements ---------------------------------------------------------------------

    def body(self, statements: list[ast.stmt]) -> list[Node]:
        out: list[Node] = []
        for statement in statements:
            out.extend(self.statement(statement))
        return out

    def statement(self, node: ast.stmt) -> list[Node]:
        if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)):
            return self.expr(node.value) if node.value is not None else []
        if isinstance(node, ast.Return):
            return [*(self.expr(node.value) if node.value is not None else []), Exit("return", self.line(node))]
        if isinstance(node, ast.Raise):
            return [*(self.expr(node.exc) if node.exc is not None else []), Exit("raise", self.line(node))]
        if isinstance(node, ast.If):
            return self._if(node)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            out = self.expr(node.iter)
            body = self.body(node.body)
            if body:
                out.append(Loop(tuple(body), f"for {_text(node.target)} in {_text(node.iter)}", self.line(node),
                                self.length(node.iter)))
            return out + self.body(node.orelse)
        if isinstance(node, ast.While):
            body = self.expr(node.test) + self.body(node.body)
            out = [Loop(tuple(body), f"while {_text(node.test)}", self.line(node))] if body else []
            return out + self.body(node.orelse)
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return self._try(node)  # type: ignore[arg-type]
        if isinstance(node, (ast.With, ast.AsyncWith)):
            out = []
            for item in node.items:
                out += self.expr(item.context_expr)
            return out + self.body(node.body)
        if isinstance(node, ast.Match):
            arms = tuple(Arm(f"case {_text(case.pattern)}", tuple(self.body(case.body))) for case in node.cases)
            out = self.expr(node.subject)
            if any(arm.body for arm in arms):
                out.append(Choice(arms + (Arm("no case matched", ()),), self.line(node)))
            return out
        if isinstance(node, ast.Assert):
            return self.expr(node.test)
        return []  # def, class, import, pass, break, continue, global…: no step

    def _if(self, node: ast.If) -> list[Node]:
        out = self.expr(node.test)
        arms = [Arm(f"if {_text(node.test)}", tuple(self.body(node.body)))]
        rest = node.orelse
        # An elif chain reads as one choice, unless an elif's test makes steps.
        while len(rest) == 1 and isinstance(rest[0], ast.If) and not self.expr(rest[0].test):
            arms.append(Arm(f"elif {_text(rest[0].test)}", tuple(self.body(rest[0].body))))
            rest = rest[0].orelse
        arms.append(Arm("else", tuple(self.body(rest))))
        if any(arm.body for arm in arms):
            out.append(Choice(tuple(arms), self.line(node)))
        return out

    def _try(self, node: ast.Try) -> list[Node]:
        body = self.body(node.body)
        handlers = tuple(
            Arm(f"except {_text(handler.type)}" if handler.type is not None else "except", tuple(self.body(handler.body)))
            for handler in node.handlers
        )
        orelse, final = self.body(node.orelse), self.body(node.finalbody)
        if not orelse and not any(arm.body for arm in handlers) and (not handlers or not body):
            return body + final  # no step depends on the outcome
        # Kept when only the body makes steps, too: a failure a handler
        # catches lets the run go on, where an uncaught one ends the block.
        return [Try(tuple(body), handlers, tuple(orelse), tuple(final), self.line(node))]

    # -- expressions, in evaluation order ---------------------------------------------------

    def expr(self, node: ast.AST | None) -> list[Node]:
        if node is None:
            return []
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Lambda):
            return []  # runs when called, not here
        if isinstance(node, ast.IfExp):
            arms = (Arm(f"if {_text(node.test)}", tuple(self.expr(node.body))), Arm("else", tuple(self.expr(node.orelse))))
            out = self.expr(node.test)
            return out + ([Choice(arms, self.line(node))] if any(arm.body for arm in arms) else [])
        if isinstance(node, ast.BoolOp):
            out = self.expr(node.values[0])
            op = "and" if isinstance(node.op, ast.And) else "or"
            for value in node.values[1:]:
                later = self.expr(value)
                if later:
                    out.append(Choice((Arm(f"{op} {_text(value)}", tuple(later)), Arm("short-circuited", ())),
                                      self.line(node)))
            return out
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            first, *others = node.generators
            out = self.expr(first.iter)
            body: list[Node] = []
            for condition in first.ifs:
                body += self.expr(condition)
            for generator in others:
                body += self.expr(generator.iter) + [n for c in generator.ifs for n in self.expr(c)]
            if isinstance(node, ast.DictComp):
                body += self.expr(node.key) + self.expr(node.value)
            else:
                body += self.expr(node.elt)
            if body:
                out.append(Loop(tuple(body), f"for {_text(first.target)} in {_text(first.iter)}", self.line(node),
                                self.length(first.iter) if not others else None))
            return out
        out = []
        for child in ast.iter_child_nodes(node):
            out += self.expr(child)
        return out

    def _call(self, node: ast.Call) -> list[Node]:
        target = self.resolve(node.func)
        out = [] if isinstance(node.func, (ast.Name,)) else self.expr(node.func)
        if _is_parallel(target):
            # Its arguments are branches to run, not values computed here
            # (a list of lambdas is a sequence branch).
            for keyword in node.keywords:
                if keyword.arg != "everystep_id":
                    out += self.expr(keyword.value)
            if self._budget():
                out.append(self._fork(node))
            return out
        for arg in node.args:
            out += self.expr(arg)
        for keyword in node.keywords:
            out += self.expr(keyword.value)
        return out + self.invoke(target, node)

    def invoke(self, target: Any, node: ast.AST) -> list[Node]:
        """What calling ``target`` (at ``node``) does, in steps."""
        if _is_patched(target):
            if not self._budget():
                return []
            first = node.args[0] if isinstance(node, ast.Call) and node.args else None
            patch_id = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            return [Patch(patch_id, _text(node), self.line(node))]
        records = _engine_records(target)
        if records is not None:
            if not self._budget():
                return []
            name, dynamic = _everystep_id(node)
            label = _text(node.func) if isinstance(node, ast.Call) else records[0]
            by_record = wait_records()
            out: list[Node] = []
            for index, record in enumerate(records):
                own_name, own_dynamic = (name, dynamic) if index == 0 else (None, False)
                kind = by_record.get(record)
                out.append(Wait(kind.kind, record, label, self.line(node), own_name, own_dynamic) if kind is not None
                           else StepCall(record, label, self.line(node), own_name, own_dynamic, False, False))
            return out
        wait = _wait_kind(target)
        if wait is not None:
            if not self._budget():
                return []
            name, dynamic = _everystep_id(node)
            label = _text(node.func) if isinstance(node, ast.Call) else wait.record
            return [Wait(wait.kind, wait.record, label, self.line(node), name, dynamic)]
        if isinstance(target, StepFunction):
            if not self._budget():
                return []
            name, dynamic = _everystep_id(node)
            label = _text(node.func) if isinstance(node, ast.Call) else target.fn.__name__
            return [StepCall(target.name, label, self.line(node), name, dynamic, target.unsafe_to_repeat,
                             target.transactional)]
        if isinstance(target, WorkflowFunction) and isinstance(target.fn, types.FunctionType):
            return self.inline(target.fn, node)
        if isinstance(target, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if self.depth >= MAX_INLINE_DEPTH:
                return []
            inner = _Reader(self.fn, target, self.offset, self.depth, self.active, self.notes, self.local_defs)
            return _local_returns(inner.body(target.body))
        if isinstance(target, ast.Lambda):
            return self.expr(target.body)
        if _user_function(target):
            return self.inline(target, node)
        return []

    def inline(self, fn: types.FunctionType, node: ast.AST) -> list[Node]:
        """The steps a plain function (or a workflow called as one) makes:
        they are recorded in the caller's scope."""
        if fn.__code__ in self.active or self.depth >= MAX_INLINE_DEPTH:
            return []
        parsed = _parse(fn)
        if isinstance(parsed, str):
            self.notes.append(f"{fn.__qualname__}: {parsed}")
            return []
        tree, offset = parsed
        reader = _Reader(fn, tree, offset, self.depth + 1, self.active | {fn.__code__}, self.notes)
        return _local_returns(reader.body(tree.body))

    def _fork(self, node: ast.Call) -> Fork:
        name, dynamic_name = _everystep_id(node)
        branches: list[tuple[Node, ...]] = []
        dynamic = False
        awaited = _is_gather(self.resolve(node.func))
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                dynamic = True
                continue
            branches.append(tuple(self._branch(arg, awaited)))
        if dynamic:
            self.notes.append(f"line {self.line(node) or '?'}: parallel() with branches built at run time; "
                              "its lanes are drawn from what was recorded")
        return Fork(tuple(branches), self.line(node), name, dynamic_name, dynamic)

    def _branch(self, arg: ast.AST, awaited: bool = False) -> list[Node]:
        """One branch of a fork. ``awaited``: a ``gather`` branch, which may
        also be an awaitable made in place (``gather(fetch(x), ...)``): the
        call is the branch, and its step runs in the branch's scope."""
        if isinstance(arg, (ast.List, ast.Tuple)):
            return [node for item in arg.elts for node in self._branch(item, awaited)]
        if isinstance(arg, ast.Lambda):
            return self.expr(arg.body)
        if isinstance(arg, ast.Call) and arg.args and self.resolve(arg.func) is functools.partial:
            # partial(step, x, everystep_id="a"): the branch calls the step.
            out = [node for value in arg.args[1:] for node in self.expr(value)]
            return out + self.invoke(self.resolve(arg.args[0]), _as_call(arg))
        if awaited and isinstance(arg, ast.Call):
            return self.expr(arg)
        return self.invoke(self.resolve(arg), arg)


def _everystep_id(node: ast.AST) -> tuple[str | None, bool]:
    for keyword in getattr(node, "keywords", ()):
        if keyword.arg == "everystep_id":
            if isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str):
                return keyword.value.value, False
            if isinstance(keyword.value, ast.Constant) and keyword.value.value is None:
                return None, False
            return None, True
    return None, False


def _wait_kind(target: Any) -> WaitKind | None:
    try:
        return waits().get(target)
    except TypeError:  # an unhashable object: not an engine call
        return None


def _engine_records(target: Any) -> tuple[str, ...] | None:
    try:
        return engine_steps().get(target)
    except TypeError:  # an unhashable object: not an engine call
        return None


def _is_parallel(target: Any) -> bool:
    """``parallel`` or its async form ``gather``: a fork, drawn alike."""
    return target is api.parallel or target is api.gather


def _is_patched(target: Any) -> bool:
    return target is patches.patched


def _is_gather(target: Any) -> bool:
    return target is api.gather


def _local_returns(nodes: list[Node]) -> list[Node]:
    """A called function's ``return`` ends that function, not the workflow:
    drop it (a ``raise`` still propagates to the caller)."""
    out: list[Node] = []
    for node in nodes:
        if isinstance(node, Exit) and node.text == "return":
            break  # whatever follows in this path is dead code
        if isinstance(node, Loop):
            node = Loop(tuple(_local_returns(list(node.body))), node.text, node.line, node.count)
        elif isinstance(node, Choice):
            node = Choice(tuple(Arm(arm.label, tuple(_local_returns(list(arm.body)))) for arm in node.arms), node.line)
        elif isinstance(node, Try):
            node = Try(tuple(_local_returns(list(node.body))),
                       tuple(Arm(arm.label, tuple(_local_returns(list(arm.body)))) for arm in node.handlers),
                       tuple(_local_returns(list(node.orelse))), tuple(_local_returns(list(node.final))), node.line)
        out.append(node)
    return out


def _as_call(partial_call: ast.Call) -> ast.Call:
    """``partial(fn, *args, **kw)`` read as the call ``fn(*args, **kw)`` it makes."""
    call = ast.Call(func=partial_call.args[0], args=partial_call.args[1:], keywords=partial_call.keywords)
    return ast.copy_location(call, partial_call)


__all__ = ["Arm", "Choice", "Exit", "Fork", "Loop", "Node", "Patch", "Plan", "StepCall", "Try", "Wait", "WaitKind",
           "analyse", "engine_steps", "wait_records", "waits"]
