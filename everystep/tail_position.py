"""Whether a call in a function's bytecode is in tail position.

A workflow whose last act is a step (``return send_receipt(order)``, or
``receipt = send_receipt(order); return receipt``) can have that step's
record and the run's terminal status written in one transaction: once the
step has returned, nothing of the body runs any more but the return of that
very value. This module answers "nothing runs any more" from the bytecode, so no
workflow has to say so: the instructions after the call must be the return
of its result, and nothing else.

Anything else after the call is not tail position, even code that looks
harmless: a ``with`` block's ``__exit__``, a ``finally`` clause, the
iterator a ``for`` loop pops, a second value built into a tuple. An
``except`` clause around the call does not matter: the step succeeded, so
it is not entered. The answer is cached per code object and offset.
"""

from __future__ import annotations

import dis
import functools
from types import CodeType

#: Instructions that call what is on the stack (3.11: CALL; 3.13: CALL_KW too).
_CALLS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"})
_RETURN = "RETURN_VALUE"
#: Instructions that push a local variable (3.14 adds the borrowing one).
_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_BORROW"})
#: Instructions that do nothing.
_IDLE = frozenset({"NOP", "CACHE", "EXTENDED_ARG"})


@functools.lru_cache(maxsize=4096)
def is_tail_call(code: CodeType, lasti: int) -> bool:
    """Whether the call the frame of ``code`` is executing (its ``f_lasti``)
    returns its result at once: ``return f(...)`` or ``x = f(...); return x``."""
    return _tail_calls(code).get(_call_at(code, lasti), False)


@functools.lru_cache(maxsize=4096)
def _instructions(code: CodeType) -> tuple[dis.Instruction, ...]:
    return tuple(instruction for instruction in dis.get_instructions(code)
                 if instruction.opname not in _IDLE)


def _call_at(code: CodeType, lasti: int) -> int:
    """The offset of the call instruction at ``lasti``: ``f_lasti`` may point
    at the call itself or at its last inline cache entry (3.11)."""
    offset = -1
    for instruction in _instructions(code):
        if instruction.offset > lasti:
            break
        offset = instruction.offset
    return offset


@functools.lru_cache(maxsize=4096)
def _tail_calls(code: CodeType) -> dict[int, bool]:
    """Offset of every call instruction in ``code`` → whether it is in tail position."""
    instructions = _instructions(code)
    answers = {}
    for index, instruction in enumerate(instructions):
        if instruction.opname in _CALLS:
            answers[instruction.offset] = _returns_at_once(instructions[index + 1:index + 4])
    return answers


def _returns_at_once(following: tuple[dis.Instruction, ...]) -> bool:
    names = [instruction.opname for instruction in following]
    if names[:1] == [_RETURN]:
        return True  # return f(...)
    if len(names) == 3 and names[0] == "STORE_FAST" and names[1] in _LOADS and names[2] == _RETURN:
        return bool(following[0].argval == following[1].argval)  # x = f(...); return x
    if names[:2] == ["STORE_FAST_LOAD_FAST", _RETURN]:
        stored, loaded = following[0].argval
        return bool(stored == loaded)  # the same, where 3.13 fuses the pair
    return False
