"""Example workflows: a CPU-heavy one, an I/O one with a parallel fork, and
one with a step that is unsafe to repeat.

Run them with the supervisor (see README):

    everystep schedule --app examples.app examples.app.crunch '{"n": 200000}' --count 10
    everystep-supervisor --app examples.app --procs 2 --burst
"""

from __future__ import annotations

import hashlib
import time

from everystep import Terminal, parallel, step, workflow


# -- CPU-heavy: true parallelism needs processes ---------------------------------


@step
def count_primes(lo: int, hi: int) -> int:
    """Pure-Python CPU work: threads would serialise on the GIL here."""
    count = 0
    for candidate in range(max(lo, 2), hi):
        if all(candidate % divisor for divisor in range(2, int(candidate ** 0.5) + 1)):
            count += 1
    return count


@step
def digest(value: int, rounds: int) -> str:
    data = str(value).encode()
    for _ in range(rounds):
        data = hashlib.sha256(data).digest()
    return data.hex()


@workflow
def crunch(args: dict) -> dict:
    n = int(args.get("n", 200_000))
    half = n // 2
    first = count_primes(0, half)
    second = count_primes(half, n)
    return {"primes_below": n, "count": first + second, "digest": digest(first + second, 20_000)}


# -- I/O with a parallel fork -----------------------------------------------------


@step
def fetch(source: str, delay: float) -> dict:
    """Stands in for an HTTP call: waits on I/O, so branches overlap."""
    time.sleep(delay)
    return {"source": source, "items": len(source) * 3}


@step
def store_report(totals: list) -> int:
    return sum(totals)


@workflow
def aggregate(args: dict) -> int:
    delay = float(args.get("delay", 0.05))
    results = parallel(
        lambda: fetch("inventory", delay),
        lambda: fetch("orders", delay),
        [lambda: fetch("users", delay), lambda: fetch("sessions", delay)],
        everystep_id="fanout",
    )
    flat = [results[0], results[1], *results[2]]
    return store_report([item["items"] for item in flat])


# -- an effect that must not happen twice ---------------------------------------


@step
def reserve(order_id: str, amount: int) -> str:
    if amount <= 0:
        raise Terminal("nothing-to-charge", {"order_id": order_id})
    return f"reservation-{order_id}"


@step(unsafe_to_repeat=True)
def charge_card(order_id: str, amount: int) -> dict:
    """Charging twice is worse than not knowing: if the process dies mid-call
    the run ends ``blocked`` for a human to resolve, never charged again."""
    return {"order_id": order_id, "charged": amount}


@step
def send_receipt(order_id: str, charge: dict) -> bool:
    return True


@workflow
def checkout(args: dict) -> dict:
    order_id = str(args["order_id"])
    amount = int(args.get("amount", 100))
    reservation = reserve(order_id, amount)
    charge = charge_card(order_id, amount)
    send_receipt(order_id, charge)
    return {"reservation": reservation, "charge": charge}
