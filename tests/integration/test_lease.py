"""The leader lease on a real PostgreSQL (issue 24 item 2): one leader, epochs that fence every write.

Time on the database side is the database's own clock; a test "lets a lease expire" by moving its expiry into
the past (the one thing a waiting test would otherwise sleep for). The replica's local clock is injected.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.lease import LeaseKeeper, PostgresLease, holder_id
from reconciler.adapters.stores import open_store
from reconciler.cli import main
from reconciler.domain.errors import LEASE_LOST
from reconciler.domain.leadership import LEADER_EPOCH_TRAILER, LeaseLost, describe
from reconciler.flows.judge import LeaderTerm, run_pass
from tests.fakes import Sleeps
from tests.gitrepos import git, make_origin, origin_log
from tests.loop_support import FakeReports, trailers
from tests.postgres_server import PostgresServer
from tests.scenarios import LATER, SPEC_YAML, completed_report


class Clock:
    """The replica's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> str:
    """A fresh database with the store's schema (the lease table is part of it), as a replica finds it."""
    return with_store_schema(postgres_server.create_database())


def with_store_schema(uri: str) -> str:
    open_store(uri).close()
    return uri


def keeper(uri: str, name: str, clock: Clock | None = None, duration_s: float = 15.0) -> LeaseKeeper:
    return LeaseKeeper(PostgresLease(uri, timeout_s=5.0), holder_id(name), duration_s, monotonic=clock or Clock())


def expire(uri: str) -> None:
    """What waiting out the lease would do: its expiry is now in the past, by the database's clock."""
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("UPDATE fleet_lease SET expires_at = clock_timestamp() - interval '1 second'")


def test_the_first_replica_leads_and_renewals_keep_its_epoch_and_since(postgres_db: str) -> None:
    a, b = keeper(postgres_db, "a:8080"), keeper(postgres_db, "b:8080")
    assert a.tick() == 1
    first = a.leader()
    assert b.tick() is None
    assert b.leader() == first and first is not None and first.holder == a.holder
    assert a.tick() == 1  # renewed: same term
    renewed = a.leader()
    assert renewed is not None and renewed.since == first.since and renewed.expires_at > first.expires_at
    assert b.tick() is None
    a.fence(1)  # the database agrees: no exception
    now = renewed.since + timedelta(seconds=1)
    assert describe(b.leader(), b.holder, now).startswith(f"replica {a.holder} leads (epoch 1) since ")
    assert describe(a.leader(), a.holder, now).startswith("this replica leads (epoch 1)")


def test_a_lapsed_lease_passes_to_another_replica_in_a_new_epoch_and_fences_the_old_one(postgres_db: str) -> None:
    a, b = keeper(postgres_db, "a:8080"), keeper(postgres_db, "b:8080")
    assert a.tick() == 1
    expire(postgres_db)
    assert b.tick() == 2
    with pytest.raises(LeaseLost, match=f"epoch 1 is no longer held by {a.holder}; {b.holder} holds epoch 2") as caught:
        a.fence(1)
    assert caught.value.reason == LEASE_LOST and caught.value.temporary
    assert a.tick() is None  # the old leader sees the new one and follows
    leader = a.leader()
    assert leader is not None and leader.holder == b.holder and leader.epoch == 2


def test_a_leader_whose_own_lease_lapsed_gets_a_new_epoch_so_its_old_pass_cannot_write(postgres_db: str) -> None:
    """SIGSTOP past the lease with nobody else around: on resume it renews, but in a NEW term."""
    a = keeper(postgres_db, "a:8080")
    assert a.tick() == 1
    expire(postgres_db)
    assert a.tick() == 2
    with pytest.raises(LeaseLost):
        a.fence(1)
    a.fence(2)


def test_locally_the_term_ends_one_lease_after_the_renewal_began_even_if_the_database_is_away(
        postgres_db: str, tmp_path: Path) -> None:
    clock = Clock()
    a = keeper(postgres_db, "a:8080", clock, duration_s=15.0)
    assert a.tick() == 1
    a.lease.close()
    a.lease.uri = "postgresql://nobody@127.0.0.1:1/nothing"  # the database is unreachable from now on
    clock.now += 10
    assert a.tick() == 1 and a.last_error is not None  # renewal failed; the term still runs
    clock.now += 5.0
    assert a.tick() is None and a.term() is None  # one lease after the last successful renewal began: done
    with pytest.raises(LeaseLost, match="cannot confirm the lease"):
        a.fence(1)


def test_a_clean_stop_releases_the_lease_so_the_next_replica_takes_over_at_once(postgres_db: str) -> None:
    a, b = keeper(postgres_db, "a:8080"), keeper(postgres_db, "b:8080")
    assert a.tick() == 1
    assert b.tick() is None
    assert not b.lease.release(b.holder, 1)  # only the holder can end its term
    a.stop(release=True)
    assert b.tick() == 2
    assert not a.lease.release(a.holder, 1)  # nor end it twice, nor end another's
    assert b.lease.release(b.holder, 2)
    assert a.tick() == 3


def test_replicas_starting_together_elect_exactly_one_leader(postgres_db: str) -> None:
    keepers = [keeper(postgres_db, f"r{i}:8080") for i in range(4)]
    results: dict[int, int | None] = {}
    start = threading.Barrier(len(keepers))

    def race(i: int) -> None:
        start.wait()
        results[i] = keepers[i].tick()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(keepers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results.values(), key=lambda v: v or 0) == [None, None, None, 1]
    leaders = {k.leader() for k in keepers}
    assert len(leaders) == 1


# --- the pass, fenced ----------------------------------------------------------------------------------


def bot(tmp_path: Path) -> tuple[Path, GitStore]:
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n"})
    git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "bot"))
    return origin, GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(3), max_attempts=2)


def test_a_pass_in_a_live_term_commits_with_its_epoch_as_a_trailer(postgres_db: str, tmp_path: Path) -> None:
    origin, store = bot(tmp_path)
    a = keeper(postgres_db, "a:8080")
    epoch = a.tick()
    assert epoch == 1
    result = run_pass(GitFleetTree(store), FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER,
                      term=LeaderTerm(epoch, lambda: a.fence(epoch)))
    assert result.ok and result.pushed
    assert trailers(origin, LEADER_EPOCH_TRAILER) == ["1"]
    assert trailers(origin, "Fleet-Instance") == ["pro-0-a"]


class Directives:
    def __init__(self) -> None:
        self.written: list[dict[str, object]] = []

    def set_directives(self, directives: dict[str, object], now: datetime, *,
                       fence: Callable[[Any], None] | None = None) -> int:
        if fence is not None:
            fence(None)
        self.written.append(dict(directives))
        return len(directives)


def test_a_pass_whose_term_ended_before_the_push_pushes_nothing_and_stores_no_directives(
        postgres_db: str, tmp_path: Path) -> None:
    origin, store = bot(tmp_path)
    a, b = keeper(postgres_db, "a:8080"), keeper(postgres_db, "b:8080")
    epoch = a.tick()
    assert epoch == 1
    expire(postgres_db)
    assert b.tick() == 2  # another replica took over while A's pass was under way
    sink = Directives()
    before = origin_log(origin)
    result = run_pass(GitFleetTree(store), FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER,
                      directive_sink=sink, term=LeaderTerm(epoch, lambda: a.fence(epoch)))
    assert not result.ok and result.reason == LEASE_LOST and not result.pushed
    assert "epoch 1 is no longer held" in (result.error or "")
    assert origin_log(origin) == before and sink.written == []
    # The new leader's pass judges the same report once, in its own term.
    reports = FakeReports([completed_report("pro-0-a", "123", 20.0)])
    b_result = run_pass(GitFleetTree(GitStore(store.workdir, sleep=Sleeps())), reports, LATER, directive_sink=sink,
                        term=LeaderTerm(2, lambda: b.fence(2)))
    assert b_result.pushed and trailers(origin, LEADER_EPOCH_TRAILER) == ["2"]
    assert trailers(origin, "Fleet-Instance") == ["pro-0-a"] and len(sink.written) == 1


def test_the_keeper_reconnects_by_itself_after_postgresql_restarts(private_postgres_server: PostgresServer) -> None:
    uri = with_store_schema(private_postgres_server.create_database())
    clock = Clock()
    a = keeper(uri, "a:8080", clock)
    assert a.tick() == 1
    private_postgres_server.stop(mode="immediate")
    clock.now += 5
    assert a.tick() == 1 and a.last_error is not None  # the renewal failed; the term still runs locally
    with pytest.raises(LeaseLost, match="cannot confirm the lease"):
        a.fence(1)  # but no write goes out unconfirmed
    private_postgres_server.start()
    clock.now += 5
    assert a.tick() == 1 and a.last_error is None  # a new connection, the same term (its lease had not run out)
    a.fence(1)


def test_fleet_status_with_the_database_says_who_leads_now(postgres_db: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    spec_dir = tmp_path / "fleet-spec"
    spec_dir.mkdir()
    (spec_dir / "fleet.yaml").write_text(SPEC_YAML)
    status = ["status", "--spec-dir", str(spec_dir), "--controller-db", postgres_db]
    assert main(status) == 0
    assert "leader: no replica holds the lease yet (as of " in capsys.readouterr().out
    a = keeper(postgres_db, "ctl-a:8443")
    assert a.tick() == 1
    assert main(status) == 0
    out = capsys.readouterr().out
    assert f"leader: replica {a.holder} leads (epoch 1) since " in out and "last pass" not in out
    password = postgres_db.split(":")[2].split("@")[0]
    wrong = postgres_db.replace(f":{password}@", ":not-the-password@")
    assert main([*status[:3], "--controller-db", wrong]) == 1  # the store refuses first: one clear error
    assert "not-the-password" not in capsys.readouterr().err


def test_directives_are_written_only_in_the_term_and_the_lease_cannot_change_hands_meanwhile(postgres_db: str) -> None:
    """The store fence runs inside the directives' transaction: a stale term writes nothing, and a take-over
    waits on the lease row (FOR SHARE) until the directives of the current term are committed."""
    store = open_store(postgres_db)
    a, b = keeper(postgres_db, "a:8080"), keeper(postgres_db, "b:8080")
    try:
        assert a.tick() == 1
        assert store.set_directives({"i-1": {"action": "serve"}}, LATER, fence=a.store_fence(1)) == 1
        inside, finish = threading.Event(), threading.Event()

        def slow_fence(conn: Any) -> None:
            a.store_fence(1)(conn)
            inside.set()
            finish.wait(60)

        writer = threading.Thread(target=store.set_directives,
                                  args=({"i-1": {"action": "stop", "reason": "judged in epoch 1"}}, LATER),
                                  kwargs={"fence": slow_fence})
        writer.start()
        assert inside.wait(60)
        takeover = threading.Thread(target=expire, args=(postgres_db,))  # what a lapse + take-over would write
        takeover.start()
        with psycopg.connect(postgres_db, autocommit=True) as watcher:
            for _ in range(10_000):  # until the take-over waits on the lease row (bounded; no sleep)
                row = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND wait_event_type = 'Lock'").fetchone()
                if row is not None and row[0] == 1:
                    break
            else:
                pytest.fail("the take-over never waited for the directives' transaction")
        finish.set()
        writer.join(60)
        takeover.join(60)
        assert (store.directive("i-1") or {}).get("action") == "stop"  # committed in epoch 1, before the take-over
        assert b.tick() == 2
        with pytest.raises(LeaseLost, match="epoch 1 is no longer held"):
            store.set_directives({"i-1": {"action": "serve", "reason": "stale"}}, LATER, fence=a.store_fence(1))
        assert (store.directive("i-1") or {}).get("action") == "stop"  # the stale term wrote nothing
    finally:
        store.close()
