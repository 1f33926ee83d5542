"""beamflow.job.snapshots: the caller never waits for a copy; one snapshot in flight, in
order; abandon drops the snapshot in hand; failures come back to the caller."""

from __future__ import annotations

import threading

import pytest

from beamflow.job.snapshots import SnapshotConsumer

HANG_GUARD_S = 60.0  # only so that a broken consumer fails instead of hanging the suite


class HeldCopy:
    """A copy that lands when the test lets it (``land``), with the value given."""

    def __init__(self, value: object) -> None:
        self.value = value
        self.landed = threading.Event()

    def land(self) -> None:
        self.landed.set()

    def result(self) -> object:
        assert self.landed.wait(HANG_GUARD_S), "the copy was never let through"
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


class Landed(HeldCopy):
    def __init__(self, value: object) -> None:
        super().__init__(value)
        self.land()


def test_submit_returns_at_once_and_the_state_is_used_once_its_copy_lands() -> None:
    consumer: SnapshotConsumer[object] = SnapshotConsumer()
    used: list[object] = []
    copy = HeldCopy("state 2")
    consumer.submit(copy, used.append)
    # the caller goes on: the copy is pending, nothing is used yet
    assert consumer.in_flight() and used == []
    copy.land()
    consumer.close()  # waits for the copy in hand, and its use
    assert used == ["state 2"] and consumer.used == 1
    assert not consumer.in_flight()


def test_one_snapshot_in_flight_and_states_used_in_order() -> None:
    consumer: SnapshotConsumer[object] = SnapshotConsumer()
    used: list[object] = []
    first = HeldCopy(1)
    consumer.submit(first, used.append)
    with pytest.raises(RuntimeError, match="in flight already"):
        consumer.submit(Landed(2), used.append)
    first.land()
    for n in range(2, 6):
        while consumer.in_flight():  # the caller would skip and try at a later iteration
            threading.Event().wait(0.001)
        consumer.submit(Landed(n), used.append)
    consumer.close()
    assert used == [1, 2, 3, 4, 5]
    with pytest.raises(RuntimeError, match="closed"):
        consumer.submit(Landed(6), used.append)


def test_abandon_drops_the_snapshot_whose_copy_is_pending() -> None:
    consumer: SnapshotConsumer[object] = SnapshotConsumer(name="abandon-test")
    used: list[object] = []
    copy = HeldCopy("old state")
    consumer.submit(copy, used.append)
    consumer.abandon()  # returns without waiting for the copy
    assert consumer.abandoned == 1
    consumer.close()  # nor does close, after abandon
    copy.land()
    for thread in threading.enumerate():  # the consumer's, which ends once its copy lands
        if thread.name == "abandon-test":
            thread.join(HANG_GUARD_S)
    assert used == [] and consumer.used == 0


def test_abandon_waits_for_a_hand_over_under_way() -> None:
    """So that the caller's own save of a newer state comes after it, never before."""
    consumer: SnapshotConsumer[object] = SnapshotConsumer()
    in_use, let_go = threading.Event(), threading.Event()
    order: list[str] = []

    def use(state: object) -> None:
        in_use.set()
        assert let_go.wait(HANG_GUARD_S)
        order.append(f"used {state}")

    consumer.submit(Landed("old"), use)
    assert in_use.wait(HANG_GUARD_S)

    def stop() -> None:
        consumer.abandon()
        order.append("newest saved")

    stopper = threading.Thread(target=stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # abandon is waiting for the hand-over
    let_go.set()
    stopper.join(HANG_GUARD_S)
    assert order == ["used old", "newest saved"]
    consumer.close()


def test_a_failed_copy_is_raised_on_the_callers_thread() -> None:
    consumer: SnapshotConsumer[object] = SnapshotConsumer()
    consumer.submit(Landed(MemoryError("device out of memory")), lambda state: None)
    with pytest.raises(MemoryError, match="device out of memory"):
        while consumer.in_flight():
            threading.Event().wait(0.001)
    consumer.close()  # raised once


def test_a_failed_use_is_raised_by_close() -> None:
    consumer: SnapshotConsumer[object] = SnapshotConsumer()

    def use(state: object) -> None:
        raise ValueError(f"refused {state}")

    consumer.submit(Landed("state"), use)
    with pytest.raises(ValueError, match="refused state"):
        consumer.close()
    consumer.close()  # closing again does nothing


def test_no_thread_without_a_snapshot() -> None:
    before = threading.active_count()
    consumer: SnapshotConsumer[object] = SnapshotConsumer()
    assert not consumer.in_flight()
    consumer.close()
    assert threading.active_count() == before
