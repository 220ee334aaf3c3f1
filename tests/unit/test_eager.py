"""Eager delivery (triage/streams/eager.py): a coroutine stepped on the spot finishes
without a task, one that waits goes on exactly where it stopped, and the loop we
install is Faust's own but for the delivery."""

from __future__ import annotations

import asyncio
import inspect
import io
import re
import tokenize
from typing import Any

import pytest
from faust.tables import recovery as faust_recovery

from triage.streams import eager


async def _put_then_tag(q: asyncio.Queue[int], value: int, log: list[str]) -> str:
    await q.put(value)
    log.append(f"put {value}")
    return f"done {value}"


def test_a_delivery_with_room_finishes_on_the_spot_without_a_task() -> None:
    async def main() -> None:
        q: asyncio.Queue[int] = asyncio.Queue(maxsize=2)
        log: list[str] = []
        tasks_before = len(asyncio.all_tasks())
        value, rest = eager.step_eagerly(_put_then_tag(q, 1, log))
        assert (value, rest, log) == ("done 1", None, ["put 1"])
        assert len(asyncio.all_tasks()) == tasks_before
        assert q.get_nowait() == 1

    asyncio.run(main())


def test_a_delivery_that_waits_goes_on_from_where_it_stopped() -> None:
    async def main() -> None:
        q: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        q.put_nowait(0)  # full: the put must wait
        log: list[str] = []
        value, rest = eager.step_eagerly(_put_then_tag(q, 1, log))
        assert value is None and rest is not None and log == []
        task = asyncio.ensure_future(rest)
        await asyncio.sleep(0.01)
        assert not task.done() and log == []  # still waiting for room, not resumed early
        assert q.get_nowait() == 0  # room
        assert await asyncio.wait_for(task, 1.0) == "done 1"
        assert log == ["put 1"] and q.get_nowait() == 1

    asyncio.run(main())


def test_cancelling_the_rest_reaches_the_waiting_coroutine() -> None:
    async def main() -> None:
        q: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        q.put_nowait(0)
        seen: list[str] = []

        async def put() -> None:
            try:
                await q.put(1)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        _, rest = eager.step_eagerly(put())
        assert rest is not None
        task = asyncio.ensure_future(rest)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled"]
        assert q.qsize() == 1  # the put never happened

    asyncio.run(main())


def test_an_error_raised_before_the_first_wait_propagates() -> None:
    async def fails() -> None:
        raise ValueError("poison")

    with pytest.raises(ValueError, match="poison"):
        eager.step_eagerly(fails())


def test_recovery_wait_for_returns_a_queued_record_at_once_and_times_out_on_an_empty_queue(
) -> None:
    eager.install()
    shim: Any = faust_recovery.asyncio

    async def main() -> None:
        q: asyncio.Queue[str] = asyncio.Queue()
        q.put_nowait("record")
        tasks_before = len(asyncio.all_tasks())
        assert await shim.wait_for(q.get(), timeout=5.0) == "record"
        assert len(asyncio.all_tasks()) == tasks_before
        with pytest.raises(asyncio.TimeoutError):
            await shim.wait_for(q.get(), timeout=0.01)
        later = asyncio.ensure_future(shim.wait_for(q.get(), timeout=1.0))
        await asyncio.sleep(0.01)
        q.put_nowait("later")
        assert await later == "later"
        assert shim.TimeoutError is asyncio.TimeoutError  # the rest is asyncio's own

    asyncio.run(main())


def _tokens(fn: Any) -> str:
    """A function's body as its tokens, comments and layout dropped."""
    src = inspect.getsource(fn)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        out.append(tok.string)
    text = "".join(out)
    return text[text.index(":", text.index(")->")) + 1:]  # after the signature


def test_the_installed_drain_loop_is_fausts_own_but_for_the_delivery() -> None:
    """Fails when an upgrade of faust-streaming changes its loop: copy it again."""
    eager.install()
    theirs = _tokens(eager.FAUST_DRAIN)
    ours = _tokens(eager._drain_messages)
    for old, new in [  # what differs, and only this
        ("cast(AsyncIterator,getmany(timeout=1.0))", "getmany(timeout=1.0)"),
        ("cast(Service,self)._stopped", "self._stopped"),
        ("cast(Service,fetcher)._stopped", "fetcher._stopped"),
        ("=CONSUMER_FETCHING", "=faust_consumer.CONSUMER_FETCHING"),
        ("ifcommit_everyisnotNone:ifself._n_acked>=commit_every:",
         "ifcommit_everyisnotNoneandself._n_acked>=commit_every:"),
        ("awaitself.wait_first(callback(message),self.suspend_flow.wait())",
         "_,rest=step_eagerly(callback(message))ifrestisnotNone:"
         "awaitself.wait_first(rest,self.suspend_flow.wait())"),
    ]:
        assert theirs.count(old) == 1, old
        theirs = theirs.replace(old, new)
    assert ours == theirs


def test_fausts_changelog_reader_still_waits_through_asyncio_wait_for_once() -> None:
    src = inspect.getsource(faust_recovery.Recovery._slurp_changelogs.fun)
    assert len(re.findall(r"asyncio\.wait_for\(\s*changelog_queue\.get\(\)", src)) == 1
    assert src.count("asyncio.wait_for(") == 1
