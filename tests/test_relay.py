"""Operator requests through the database and runner detail, at the Store
level, on both backends: each request is taken once, answered once, and a
request nobody took can be expired so it is never acted on."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from everystep import relay
from everystep.errors import EverystepError
from everystep.relay import RequestStatus


def test_a_request_goes_pending_taken_answered(store: Any) -> None:
    request = relay.submit(store, "sup-a", "scale", {"procs": 3}, "console 127.0.0.1 (local)")
    assert request.status == RequestStatus.PENDING and request.args == {"procs": 3}
    assert store.take_requests("sup-b") == []  # addressed to someone else
    taken = store.take_requests("sup-a")
    assert [r.id for r in taken] == [request.id]
    assert taken[0].status == RequestStatus.TAKEN and taken[0].command == "scale"
    assert taken[0].age_seconds is not None and taken[0].age_seconds >= 0
    assert store.take_requests("sup-a") == []  # taken once
    assert store.expire_request(request.id) is False  # too late to expire
    assert store.answer_request(request.id, {"ok": True, "procs": 3, "previous": 2})
    assert store.answer_request(request.id, {"ok": False}) is False  # answered once
    final = store.get_request(request.id)
    assert final.status == RequestStatus.ANSWERED and final.reply == {"ok": True, "procs": 3, "previous": 2}
    assert final.requested_by == "console 127.0.0.1 (local)" and final.answered_at is not None
    assert relay.describe_outcome(final) == "ok: procs 3, previous 2"


def test_an_expired_request_is_never_taken(store: Any) -> None:
    request = relay.submit(store, "sup-a", "kill", {"run": "x", "requeue": False}, "cli")
    assert store.expire_request(request.id) is True
    assert store.take_requests("sup-a") == []
    final = store.get_request(request.id)
    assert final.status == RequestStatus.EXPIRED
    assert "not answering" in relay.describe_outcome(final)


def test_wait_reply_expires_what_nobody_took(store: Any) -> None:
    request = relay.submit(store, "nobody", "status", {}, "cli")
    final = relay.wait_reply(store, request.id, timeout=0.3, poll=0.05)
    assert final.status == RequestStatus.EXPIRED


def test_wait_reply_returns_the_answer(store: Any) -> None:
    request = relay.submit(store, "sup-a", "status", {}, "cli")

    def answer() -> None:
        for taken in store.take_requests("sup-a"):
            store.answer_request(taken.id, {"ok": True, "pid": 1})

    thread = threading.Timer(0.2, answer)
    thread.start()
    try:
        final = relay.wait_reply(store, request.id, timeout=30, poll=0.05)
    finally:
        thread.join()
    assert final.status == RequestStatus.ANSWERED and final.reply == {"ok": True, "pid": 1}


def test_requests_race_to_one_taker(store: Any) -> None:
    ids = {relay.submit(store, "sup-a", "status", {}, "cli").id for _ in range(20)}
    seen: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(10):
            got = store.take_requests("sup-a", 3)
            with lock:
                seen.extend(r.id for r in got)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == sorted(ids)  # every request once, none twice


def test_submit_refuses_unknown_commands_and_bad_args(store: Any) -> None:
    with pytest.raises(EverystepError, match="unknown supervisor command"):
        relay.submit(store, "sup-a", "rm -rf", {}, "cli")
    with pytest.raises(EverystepError, match="JSON object"):
        relay.submit(store, "sup-a", "scale", [1], "cli")  # type: ignore[arg-type]


def test_runner_detail_is_read_only_from_the_current_holder(store: Any) -> None:
    store.register_runner("sup-a", "inst-1", "supervisor", "host", 1, 60, vet=lambda holder: None)
    assert store.publish_runner_detail("sup-a", "inst-1", {"instance": "inst-1", "children": [{"slot": 1}]})
    assert store.runner_details() == {"sup-a": {"instance": "inst-1", "children": [{"slot": 1}]}}
    assert store.publish_runner_detail("sup-a", "intruder", {"instance": "intruder"}) is False
    # A restart under the same name: the predecessor's detail is not shown.
    store.register_runner("sup-a", "inst-2", "supervisor", "host", 2, 60, vet=lambda holder: None)
    assert store.runner_details() == {}
    assert store.publish_runner_detail("sup-a", "inst-2", {"instance": "inst-2", "children": []})
    assert store.runner_details()["sup-a"]["children"] == []
