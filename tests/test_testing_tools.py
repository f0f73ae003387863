"""The tools idemstore.testing offers backend authors: what a test sets is what it gets."""

from __future__ import annotations

import time

import pytest

from idemstore.testing import FakeClock, FaultProxy


def test_a_frozen_clock_moves_only_when_the_test_moves_it() -> None:
    clock = FakeClock(1_000_000.0)
    assert clock() == clock() == 1_000_000.0
    clock.advance(29.9)
    assert clock() == 1_000_000.0 + 29.9
    clock.now = 1_700_000_000.123
    assert clock() == 1_700_000_000.123  # exactly the reading set, no drift


def test_a_ticking_clock_follows_the_wall_clock_plus_its_offset() -> None:
    clock = FakeClock.ticking()
    before = time.time()
    reading = clock()
    assert before <= reading <= time.time()
    clock.offset = 11.0
    assert clock() >= before + 11.0


def test_a_skewed_clock_reads_its_base_plus_a_skew_that_can_change() -> None:
    owner = FakeClock(1000.0)
    taker = owner.skewed(by=0.5)
    assert taker() == 1000.5
    owner.advance(10)
    assert taker() == 1010.5  # it moves with its base
    taker.offset = -2.0
    assert taker() == 1008.0


def test_a_fault_proxy_refuses_faults_before_it_is_started() -> None:
    proxy = FaultProxy("127.0.0.1", 9)
    with pytest.raises(RuntimeError, match="start"):
        proxy.hang()
    with pytest.raises(RuntimeError, match="start"):
        proxy.drop_next_reply()
