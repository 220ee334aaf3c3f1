"""A shard taken over from a process killed mid-batch, against real Kafka: the new owner
fences the old writer, so read_committed readers (workers, clients) do not wait out the
dead process's transaction timeout (5 minutes) behind its open transaction. Found by
tests/faults/test_scale.py: after kill -9 the GPU of the dead instance's shard saw none
of its new work for the whole test."""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import NewTopic

from tests.integration._dying_outbox import run_until_killed
from tests.integration._reading import read_partition
from triage.kafka.clients import make_admin
from triage.streams.outbox import MARK_KEY, Committed, KafkaOutbox, OutboxFencedError
from triage.topics.messages import OutboxMark


def _topics(bootstrap: str, *names: str) -> None:
    admin = make_admin(bootstrap)  # held until the results: its handle must outlive them
    for f in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        f.result(timeout=30)


def _committed_values(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    """What a read_committed reader (a worker) is handed from the partition, up to its end
    (empty when an open transaction holds it back)."""
    return [m.value() or b"" for m in read_partition(bootstrap, topic, partition)]


def _writer(bootstrap: str, transactional_id: str) -> Producer:
    """A transactional producer under `transactional_id`, initialized: a writer of marks
    as an outbox lane would be, driven by hand."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    p.init_transactions(30)
    return p


def _mark(p: Producer, marks: str, seq: int, writer: str) -> None:
    """Batch `seq`'s mark of `writer` on shard 1's marks partition."""
    p.produce(marks, OutboxMark(seq=seq, writer=writer).to_bytes(), MARK_KEY, partition=1)


def _held_then_released(bootstrap: str, marks: str, work: str, survivor_id: str) -> KafkaOutbox:
    """The survivor's own work for shard 1 lands behind the dead writer's open batch 8
    (batch 7 committed); taking the shard over fences the writer and releases it."""
    later = Producer({"bootstrap.servers": bootstrap})
    later.produce(work, b"new", partition=1)
    later.flush(10)
    assert _committed_values(bootstrap, work, 1) == [b"w7"]  # held back
    survivor = KafkaOutbox(bootstrap, transactional_id=survivor_id, marks_topic=marks, shards=2)
    assert survivor.take_over(1) == Committed(7, 7)  # the open batch 8 never committed
    assert _committed_values(bootstrap, work, 1) == [b"w7", b"new"]  # 8 aborted
    return survivor


def test_taking_a_shard_over_fences_a_writer_that_left_its_transaction_open(
    kafka_bootstrap: str,
) -> None:
    tag = uuid.uuid4().hex[:8]
    marks, work = f"fence-{tag}.outbox", f"fence-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    dead_id = f"fence-{tag}.outbox.instance-i0"
    zombie = _writer(kafka_bootstrap, dead_id)
    zombie.begin_transaction()  # batch 7 commits: work and the shard's mark
    zombie.produce(work, b"w7", partition=1)
    _mark(zombie, marks, 7, dead_id)
    zombie.commit_transaction(30)
    zombie.begin_transaction()  # batch 8 is in flight when the process dies
    zombie.produce(work, b"w8", partition=1)
    _mark(zombie, marks, 8, dead_id)
    zombie.flush(10)
    survivor = _held_then_released(kafka_bootstrap, marks, work,
                                   f"fence-{tag}.outbox.instance-i1")
    # nothing open any more: a second take-over fences no one and reads the same
    assert survivor.take_over(1) == Committed(7, 7)
    assert survivor.take_over(0) == Committed(0, 0)  # a shard nobody wrote


def _writing_shard_1(bootstrap: str, transactional_id: str, marks: str) -> KafkaOutbox:
    """An outbox started as the owner of shard 1 of two."""
    outbox = KafkaOutbox(bootstrap, transactional_id=transactional_id, marks_topic=marks,
                         shards=2)
    outbox.start()
    outbox.mark_partitions.add(1)
    return outbox


def test_a_fenced_outbox_refuses_to_send_its_batch_again(kafka_bootstrap: str) -> None:
    """A process whose transactional id a newer owner took over (it was frozen while its
    shard moved) must not re-initialize and send the batch anyway: the batch's outputs
    are the new owner's to replay. publish raises OutboxFencedError (the committer then
    exits the process) and nothing of the batch reaches a read_committed reader."""
    tag = uuid.uuid4().hex[:8]
    marks, work = f"fenced-{tag}.outbox", f"fenced-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    zombie = _writing_shard_1(kafka_bootstrap, f"fenced-{tag}.outbox.instance-i0", marks)
    zombie.publish(1, [(work, b"k", b"before", 1, None)], marks=zombie.mark_partitions)
    _writer(kafka_bootstrap, f"fenced-{tag}.outbox.instance-i0")  # what a takeover's fence does
    with pytest.raises(OutboxFencedError):
        zombie.publish(2, [(work, b"k", b"after", 1, None)], marks=zombie.mark_partitions)
    assert _committed_values(kafka_bootstrap, work, 1) == [b"before"]


def test_a_writer_killed_after_its_outputs_are_written_is_fenced_on_takeover(
    kafka_bootstrap: str,
) -> None:
    """The outbox itself, killed with SIGKILL once a batch's outputs are on the broker and
    before its transaction commits. The takeover sees the open transaction on the shard's
    marks partition only if the mark was written before the outputs: written after them
    (as before 2026-12-05), a kill between the two left the work partition held for the
    whole transaction timeout with no trace on the marks partition, so nothing fenced the
    dead writer (the two-instance kill -9 test lost 56 of 500 replies that way)."""
    tag = uuid.uuid4().hex[:8]
    marks, work = f"killed-{tag}.outbox", f"killed-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    dead_id = f"killed-{tag}.outbox.instance-i0"
    run_until_killed(kafka_bootstrap, dead_id, marks, work, "",
                     [(7, "work", "work", "w7"), (8, "work", "work", "w8,last output")],
                     last="last output")
    _held_then_released(kafka_bootstrap, marks, work, f"killed-{tag}.outbox.instance-i1")


def test_a_batch_whose_sender_left_the_group_during_its_marks_is_not_committed(
    kafka_bootstrap: str,
) -> None:
    """Frozen between the guard's check and its marks, a process finds no open transaction
    fenced on waking, since a takeover during the freeze saw none: the membership check
    asked once the marks are out (lapse.py, SendCheck) must abort the batch, or the
    batch the new owner re-sent is answered twice (the frozen-owner test, once in CI)."""
    tag = uuid.uuid4().hex[:8]
    marks, work = f"lapsed-{tag}.outbox", f"lapsed-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    sender = _writing_shard_1(kafka_bootstrap, f"lapsed-{tag}.outbox.instance-i0", marks)
    asked: list[int] = []

    def listed() -> bool:
        asked.append(1)
        return True

    sender.publish(1, [(work, b"k", b"before", 1, None)], still_member=listed,
                   marks=sender.mark_partitions)
    with pytest.raises(OutboxFencedError, match="no longer lists"):
        sender.publish(2, [(work, b"k", b"after", 1, None)], still_member=lambda: False,
                       marks=sender.mark_partitions)
    assert asked == [1]
    assert _committed_values(kafka_bootstrap, work, 1) == [b"before"]
    # nothing left open: the shard's next owner reads batch 1 as the last committed
    survivor = KafkaOutbox(kafka_bootstrap, transactional_id=f"lapsed-{tag}.outbox.instance-i1",
                           marks_topic=marks, shards=2)
    assert survivor.take_over(1) == Committed(1, 1)


def test_a_takeover_fences_the_writer_of_the_open_batch_not_of_the_last_committed_one(
    kafka_bootstrap: str,
) -> None:
    """The open transaction on a marks partition is not always its last committed
    writer's: a new owner killed in its first batch after a takeover, or a woken zombie
    cut down between its marks and their abort, leaves one open behind another writer's
    committed mark. The takeover must fence the writer named by the open batch's own
    mark: fencing the last committed writer left the open one holding every
    read_committed reader of its partitions for the 5-minute transaction timeout."""
    tag = uuid.uuid4().hex[:8]
    marks, work = f"behind-{tag}.outbox", f"behind-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    first_id, second_id = f"behind-{tag}.outbox.instance-i0", f"behind-{tag}.outbox.instance-i1"
    first = _writer(kafka_bootstrap, first_id)
    first.begin_transaction()  # batch 7 of the first owner commits
    first.produce(work, b"w7", partition=1)
    _mark(first, marks, 7, first_id)
    first.commit_transaction(30)
    second = _writer(kafka_bootstrap, second_id)
    second.begin_transaction()  # the next owner's first batch is in flight when it dies
    _mark(second, marks, 1, second_id)
    second.flush(10)
    second.produce(work, b"s1", partition=1)
    second.flush(10)
    _held_then_released(kafka_bootstrap, marks, work, f"behind-{tag}.outbox.instance-i2")
    with pytest.raises(KafkaException):  # the open batch's writer was the one fenced
        second.commit_transaction(10)


def test_a_process_leaving_as_a_zombie_lets_the_send_checks_abort_finish_first(
    kafka_bootstrap: str,
) -> None:
    """The lapse guard exits the process as soon as the broker says it left the group; a
    lane thread may then be between its marks and the abort its own send check asked for.
    Exited there (once in the frozen-owner test under CPU contention), the marks-only
    transaction stayed open, and the next reader of the shard's marks took an older batch
    for the last committed one. `quiesce` returns only once the lane is out of it."""
    tag = uuid.uuid4().hex[:8]
    marks, work = f"quiesce-{tag}.outbox", f"quiesce-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    sender = _writing_shard_1(kafka_bootstrap, f"quiesce-{tag}.outbox.instance-i0", marks)
    sender.publish(1, [(work, b"k", b"before", 1, None)], marks=sender.mark_partitions)
    asking, answer = threading.Event(), threading.Event()

    def slow_no() -> bool:  # the broker's answer takes a while under load
        asking.set()
        answer.wait(10)
        return False

    failed: list[BaseException] = []

    def publish() -> None:
        try:
            sender.publish(2, [(work, b"k", b"after", 1, None)], still_member=slow_no,
                           marks=sender.mark_partitions)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    assert asking.wait(30)  # the marks of batch 2 are on the broker, its check in flight
    reader = KafkaOutbox(kafka_bootstrap, transactional_id=f"quiesce-{tag}.reader",
                         marks_topic=marks, shards=2)
    assert reader.work.last_marker(1).open  # what an exit here would leave behind
    threading.Timer(3.0, answer.set).start()
    assert sender.quiesce(20.0)
    state = reader.work.last_marker(1)  # read before the thread is joined
    assert (state.open, state.seq) == (False, 1)
    thread.join(10)
    assert [type(e) for e in failed] == [OutboxFencedError]
    assert _committed_values(kafka_bootstrap, work, 1) == [b"before"]


def test_a_transaction_left_open_at_the_start_of_the_marks_is_found_and_fenced(
    kafka_bootstrap: str,
) -> None:
    """The first record of a shard's marks partition is a batch left open (its first
    writer killed in its first batch), and another writer committed 200 batches after it.
    Read committed, the partition's end is then its start: the reader took it for an
    empty partition with nothing open, so nobody fenced the dead writer and its
    transaction held every read_committed reader of its partitions for 5 minutes."""
    tag = uuid.uuid4().hex[:8]
    marks, work = f"far-{tag}.outbox", f"far-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    zombie_id, owner_id = f"far-{tag}.outbox.instance-i0", f"far-{tag}.outbox.instance-i1"
    zombie = _writer(kafka_bootstrap, zombie_id)
    zombie.begin_transaction()
    _mark(zombie, marks, 3, zombie_id)
    zombie.flush(10)
    owner = _writer(kafka_bootstrap, owner_id)
    for seq in range(1, 201):  # the owner goes on committing its batches
        owner.begin_transaction()
        _mark(owner, marks, seq, owner_id)
        owner.commit_transaction(30)
    taker = KafkaOutbox(kafka_bootstrap, transactional_id=f"far-{tag}.outbox.instance-i2",
                        marks_topic=marks, shards=2)
    assert taker.take_over(1) == Committed(200, 200)
    with pytest.raises(KafkaException):  # the open batch's writer was fenced
        zombie.commit_transaction(10)


def test_the_last_committed_mark_is_found_behind_a_run_of_aborted_batches(
    kafka_bootstrap: str,
) -> None:
    """Each aborted batch leaves its mark and an abort marker on the marks partition, both
    skipped by a read_committed reader. Behind a run of them (a writer whose transactions
    failed again and again), the reader's first window held no committed mark, and the
    shard's next owner took batch 0 for the last committed: it would have sent every
    output its records hold again."""
    tag = uuid.uuid4().hex[:8]
    marks, work = f"aborted-{tag}.outbox", f"aborted-{tag}.work"
    _topics(kafka_bootstrap, marks, work)
    writer_id = f"aborted-{tag}.outbox.instance-i0"
    writer = _writer(kafka_bootstrap, writer_id)
    writer.begin_transaction()
    _mark(writer, marks, 5, writer_id)
    writer.commit_transaction(30)
    for seq in range(6, 46):  # 40 batches that never commit
        writer.begin_transaction()
        _mark(writer, marks, seq, writer_id)
        writer.flush(10)
        writer.abort_transaction(30)
    taker = KafkaOutbox(kafka_bootstrap, transactional_id=f"aborted-{tag}.outbox.instance-i1",
                        marks_topic=marks, shards=2)
    assert taker.take_over(1) == Committed(5, 5)
