"""A Redis Cluster losing a master mid-run: the run goes on through the failover, pays twice at
most the calls that were in flight, ends every row (ok, or failed naming the failover), and a
rerun pays nothing more.

Each test starts a Redis Cluster of its own (3 masters, each with a replica), since it kills one
of its masters; the processes run the play as the ``redis cluster`` engine of the promise suite
does (fresh Python processes, the store and the provider's shared limits at one node's URL).  The
demo provider is in a process of its own, and its counters are the ground truth of what was paid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import Outcome, RedisCluster
from promises import answered, email, enrich, people, requests

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer

ROWS = 240
CONCURRENCY = 4  # each process's
FAILOVER = "lost a master"  # what a row's error says when the cluster stayed down past its wait


@pytest.fixture
def cluster() -> Iterator[RedisClusterServer]:
    """A Redis Cluster of this test's own: it kills one of its masters."""
    with RedisClusterServer() as own:
        yield own


def _through_a_failover(
    cluster: RedisClusterServer, demo: Any, tmp_path: Path, provider: str, processes: int
) -> tuple[Outcome, int, pb.Play]:
    """``processes`` processes map the same rows on the cluster; a master is SIGKILLed once a
    third of the rows were asked for.  The outcome, and what the demo had in flight then."""
    demo.reset(latency=0.1)
    engine = RedisCluster(cluster.url, tmp_path)
    play = enrich(email(demo, pb.Provider(provider, rps=200, concurrency=8, max_wait=60)))

    def kill() -> int:
        flying = int(demo.stats()["in_flight"])
        cluster.kill()
        return flying

    outcome, flying = engine.run_while(
        people(ROWS),
        play,
        lambda: requests(demo) >= ROWS // 3,
        kill,
        processes=processes,
        concurrency=CONCURRENCY,
    )
    return outcome, flying, play


def _every_row_ended(outcome: Outcome) -> int:
    """Each row ok or reused, or failed naming the failover: how many failed so."""
    assert outcome.result is not None and outcome.fatal is None, outcome.fatal
    statuses = outcome.result["play_status"]
    failed = outcome.result.loc[~statuses.isin(["ok", "reused"]), ["play_status", "play_error"]]
    # the store said, as it opened the cluster, what a failover may lose and how that is bounded
    assert any("is on a Redis Cluster" in note for note in outcome.notices), outcome.notices
    assert (failed["play_status"] == "failed").all(), failed
    assert all(FAILOVER in str(error) for error in failed["play_error"]), failed["play_error"].tolist()
    return len(failed)


def _paid_twice_within_in_flight_and_a_rerun_pays_nothing(
    cluster: RedisClusterServer,
    demo: Any,
    tmp_path: Path,
    play: pb.Play,
    processes: int,
    failed: int,
    flying: int,
) -> None:
    engine = RedisCluster(cluster.url, tmp_path)
    before = requests(demo)
    rerun = engine.run(people(ROWS), play, concurrency=CONCURRENCY)
    assert set(rerun.statuses) <= {"ok", "reused"} and sum(rerun.statuses.values()) == ROWS, rerun.statuses
    # The rerun pays for the rows that failed naming the failover, and for nothing else.
    assert requests(demo) - before == rerun.total("calls_executed") <= failed
    again = engine.run(people(ROWS), play, concurrency=CONCURRENCY)
    assert again.statuses == {"reused": ROWS} and requests(demo) - before == rerun.total("calls_executed")
    # Every call is one person's: the demo answering one more than once is a call paid twice.
    in_flight = processes * CONCURRENCY
    paid_twice = answered(demo) - ROWS
    assert 0 <= paid_twice <= in_flight, (
        f"{paid_twice} calls paid twice; the processes had at most {in_flight} in flight "
        f"(the provider was answering {flying} when the master was killed)"
    )


def test_processes_on_the_same_rows_ride_out_a_master_killed_mid_run(
    cluster: RedisClusterServer, demo_elsewhere: Any, tmp_path: Path, name: Callable[[str], str]
) -> None:
    """Three processes mapping the same rows, a master SIGKILLed mid-run: every row ends ok (or
    names the failover), the calls paid twice are at most those in flight, a rerun pays nothing."""
    outcome, flying, play = _through_a_failover(cluster, demo_elsewhere, tmp_path, name("acme"), 3)
    failed = _every_row_ended(outcome)
    assert cluster.killed and len(cluster.masters()) == 3  # the replica took over
    _paid_twice_within_in_flight_and_a_rerun_pays_nothing(
        cluster, demo_elsewhere, tmp_path, play, 3, failed, flying
    )


def test_one_process_rides_out_a_master_killed_mid_run(
    cluster: RedisClusterServer, demo_elsewhere: Any, tmp_path: Path, name: Callable[[str], str]
) -> None:
    """One process, a master SIGKILLed mid-run: every row ends ok (or names the failover), the
    calls paid twice are at most those in flight, a rerun pays nothing."""
    outcome, flying, play = _through_a_failover(cluster, demo_elsewhere, tmp_path, name("acme"), 1)
    failed = _every_row_ended(outcome)
    _paid_twice_within_in_flight_and_a_rerun_pays_nothing(
        cluster, demo_elsewhere, tmp_path, play, 1, failed, flying
    )
