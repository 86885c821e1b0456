"""Each capacity rule through the real reconcile loop, on an injected clock: `flows.judge.run` driving `run_pass`
(as `fleet reconcile` does) with the real SQLite controller store, a real bare git origin, and curio's queue and
Snark Market in a REAL PostgreSQL holding curio's own tables (tests/fixtures/curio: harmony_task.sql and
proofshare.sql, from curio's migrations) read by a SELECT-only role.

Simulated time (no sleeps, so a loaded machine cannot move a window): the loop's `sleep` advances the clock in
half-second ticks, and at each tick the simulated world acts: workers send heartbeats every 3 s to the store
(stamped with the simulated clock, as the store stamps arrivals), curio posts and claims tasks in PostgreSQL
with simulated `posted_time`s. Short timings: windows 15 s up / 30 s down, cooldown 15 s, lost_after 30 s, a
pass every 2 s. Shown, one rule per test: fleet-wide silence and an unreachable queue change no count (and say
why); a queue that flickers faster than the window moves nothing; a lowered max and a pin drain the worst
$/proof machine mid-proof instead of stopping the highest slot; Snark Market work grows the pool only while it
pays, its unpaid work is idleness, and a machine that misses its deadlines gets a serving verdict.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.curio_queue import CurioQueue
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.record_files import RecordCache
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli import main
from reconciler.cli._shared import last_pass_path
from reconciler.domain.observations import format_time
from reconciler.flows.judge import PassMemory, PassResult, run, run_pass
from tests.gitrepos import clone, git, human_commit, make_origin, origin_file
from tests.postgres_server import PostgresServer
from tests.scenarios import DIGEST

FIXTURES = Path(__file__).parent.parent / "fixtures" / "curio"
DDL = (FIXTURES / "harmony_task.sql").read_text() + "\n" + (FIXTURES / "proofshare.sql").read_text()
READ_TABLES = ("harmony_task", "harmony_task_history", "harmony_machines", "harmony_machine_details",
               "proofshare_provider_payments", "proofshare_meta", "sectors_sdr_pipeline")

SPEC = """\
version: 1
image: {repository: ghcr.io/example/cuzk-worker}
controller: {url: http://127.0.0.1:8080}
max_total_dph: 3.0
serving: {heartbeat_minutes: 0.05, window_minutes: 1, lost_after_minutes: 0.5, min_proofs: 3}
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: {min: 1, max: 6}
    min_rate_proofs_per_hour: 2400
    max_price_usd_per_hour: 0.5
    scaling: {target_utilization: 0.8, scale_up_after_minutes: 0.25, scale_down_after_minutes: 0.5,
              cooldown_minutes: 0.25}
    queue: {url_env: CURIO_DB_URL, task_types: [PoRep]}
"""
#: $0.50/h over 2400 proofs/h = $0.000208/proof at the worst; +20% margin: $0.00025 = 0.0000625 FIL at $4/FIL.
MARKET_SPEC = SPEC.replace("task_types: [PoRep]}", "task_types: [PoRep],\n            market: {min_margin: 0.2, "
                           "usd_per_fil: 4.0, deadline_minutes: 1, deadline_misses: 2}}")
BEAT_S = 3.0
PASS_S = 2.0
TICK_S = 0.5
FIL = 10**18


def capacity_line(desired: int, slots: list[int], changed_at: datetime, direction: str = "up") -> str:
    doc = {"desired": desired, "slots": slots, "draining": [], "changed_at": format_time(changed_at),
           "direction": direction, "reason": "an earlier decision", "signals": {}}
    return f'"rtx4090": {json.dumps(doc)}\n'


class Clock:
    def __init__(self, start: datetime) -> None:
        self.t = start

    def __call__(self) -> datetime:
        return self.t


class World:
    """The simulated fleet around the loop: workers (through the store's API, on the simulated clock) and curio."""

    def __init__(self, store: SqliteStore, clock: Clock, curio: Curio) -> None:
        self.store, self.clock, self.curio = store, clock, curio
        self.workers: dict[str, dict[str, Any]] = {}
        self.silent = False  # the controller hears no worker (an outage or a partition)
        self.queued: dict[str, list[dict[str, Any]]] = {}  # heartbeats a silent worker holds back
        self.on_tick: list[Callable[[datetime], None]] = []
        self._next_beat = clock() + timedelta(seconds=BEAT_S)

    def start(self, iid: str, slot: str, rate: float) -> None:
        """A worker that registered, passed its benchmark at `rate` and serves (busy by default)."""
        now = _iso(self.clock())
        self.store.register(iid, {"protocol": 1, "instance_id": iid, "at": now, "pool": "rtx4090", "slot": slot,
                                  "machine_id": f"m-{iid}", "host_id": "h-1", "gpu_name": "RTX 4090",
                                  "image_digest": DIGEST})
        for phase, status in (("params", "started"), ("params", "done"), ("benchmark", "started")):
            self.store.add_event(iid, {"protocol": 1, "phase": phase, "status": status, "at": now})
        self.store.set_result(iid, {"protocol": 1, "outcome": "completed", "at": now, "requested": 10,
                                    "completed": 10, "failed": 0, "exit_code": 0, "proofs_per_hour": rate,
                                    "seconds_per_proof": round(3600 / rate, 3), "image_digest": DIGEST})
        self.store.add_event(iid, {"protocol": 1, "phase": "serve", "status": "started", "at": now})
        self.workers[iid] = {"rate": rate, "busy": True, "seq": 0, "stopped": False}

    def stop(self, iid: str) -> None:
        """What serve.sh sends once drained."""
        self.workers[iid]["stopped"] = True
        self.store.add_event(iid, {"protocol": 1, "phase": "serve", "status": "done", "at": _iso(self.clock()),
                                   "message": "drained: no proofs left in progress"})

    def busy(self, value: bool) -> None:
        for w in self.workers.values():
            w["busy"] = value

    def tick(self) -> None:
        self.clock.t += timedelta(seconds=TICK_S)
        now = self.clock()
        for act in self.on_tick:
            act(now)
        if now < self._next_beat:
            return
        self._next_beat += timedelta(seconds=BEAT_S)
        for iid, w in self.workers.items():
            if w["stopped"]:
                continue
            w["seq"] += 1
            busy = w["busy"] if not callable(w["busy"]) else w["busy"](now)
            hb = {"protocol": 1, "phase": "serve", "status": "progress", "at": _iso(now),
                  "message": f"heartbeat {w['seq']}",
                  "details": {"heartbeat": {"seq": w["seq"], "interval_s": BEAT_S, "failed": 0, "busy": busy,
                                            "completed": round(w["rate"] * BEAT_S / 3600) if busy else 0}}}
            self.queued.setdefault(iid, []).append(hb)
            if not self.silent:  # after an outage the queued ones arrive together (stamped on arrival)
                for doc in self.queued.pop(iid):
                    self.store.add_event(iid, doc)


class Curio:
    """curio's side in PostgreSQL: tasks posted and claimed at simulated times (its own `posted_time`)."""

    def __init__(self, server: PostgresServer, db: str) -> None:
        self.server, self.db = server, db

    def sql(self, statement: str) -> None:
        self.server.execute(statement, self.db)

    def post(self, name: str, n: int, at: datetime, owner: str | None = None) -> None:
        owner_sql = "NULL" if owner is None else \
            f"(SELECT id FROM harmony_machines WHERE host_and_port = '{owner}')"  # noqa: S608
        for _ in range(n):
            self.sql("INSERT INTO harmony_task (posted_time, owner_id, added_by, name) VALUES "  # noqa: S608
                     f"('{at.isoformat()}', {owner_sql}, 1, '{name}')")

    def claim_all(self, name: str) -> None:
        self.sql(f"UPDATE harmony_task SET owner_id = 1 WHERE name = '{name}' AND owner_id IS NULL")  # noqa: S608

    def node(self, host: str, machine_name: str) -> None:
        """A curio node (the worker's, run with CURIO_NODE_NAME = its instance id) in harmony_machines."""
        self.sql("INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu) VALUES "  # noqa: S608
                 f"('{host}', 32, 1, 1)")
        self.sql("INSERT INTO harmony_machine_details (machine_id, machine_name, tasks, layers) "  # noqa: S608
                 f"SELECT id, '{machine_name}', 'PSProve', 'gpu' FROM harmony_machines WHERE host_and_port = "
                 f"'{host}'")


class Loop:
    """`fleet reconcile`'s loop, in this process, on the simulated clock."""

    def __init__(self, tmp_path: Path, spec: str, capacity: str, curio_url: str) -> None:
        self.origin, self.seed = make_origin(tmp_path, {"fleet-spec/fleet.yaml": spec,
                                                       "fleet-spec/capacity.yaml": capacity})
        self.workdir = tmp_path / "bot"
        self.tree = GitFleetTree(GitStore.clone(str(self.origin), self.workdir), record_cache=RecordCache())
        self.human = clone(self.origin, tmp_path / "human")
        self.clock = Clock(datetime.now(UTC).replace(microsecond=0))
        self.db = tmp_path / "controller.db"
        self.store = SqliteStore(self.db, now=self.clock)
        self.queue = CurioQueue({"CURIO_DB_URL": curio_url})
        self.memory = PassMemory()  # the leader's warm state, the demand samples with it
        self.results: list[PassResult] = []

    def passes(self, n: int, world: World) -> list[PassResult]:
        """`n` passes PASS_S apart, the world ticking between them."""
        def one_pass(now: datetime) -> PassResult:
            return run_pass(self.tree, self.store, now, desired_image_digest=DIGEST, directive_sink=self.store,
                            queue_reader=self.queue, memory=self.memory)

        def on_pass(result: PassResult) -> None:  # what `fleet reconcile` writes for status and the page
            last_pass_path(self.workdir).write_text(json.dumps(result.to_json()))

        def sleep(seconds: float) -> None:
            for _ in range(round(seconds / TICK_S)):
                world.tick()

        done = run(one_pass, interval_s=PASS_S, stop_event=threading.Event(), clock=self.clock, sleep=sleep,
                   on_pass=on_pass, max_passes=n)
        for result in done:
            assert result.ok, result.headline()
        self.results += done
        return done

    def trailers(self) -> list[str]:
        out = git(self.origin, "log", "--reverse", "--format=%(trailers:key=Fleet-Capacity,valueonly)", "main")
        return [line for line in out.splitlines() if line.strip()]

    def capacity(self) -> dict[str, Any]:
        text = origin_file(self.origin, "fleet-spec/capacity.yaml") or ""
        line = next(line for line in text.splitlines() if line.startswith('"rtx4090"'))
        return dict(json.loads(line.split(": ", 1)[1]))

    def last(self) -> dict[str, Any]:
        return dict(self.results[-1].to_json()["capacity"][0])

    def directive(self, iid: str) -> str | None:
        return (self.store.directive(iid) or {}).get("action")

    def close(self) -> None:
        self.store.close()


def _iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture
def curio_db(postgres_server: PostgresServer) -> Iterator[tuple[Curio, str]]:
    uri = postgres_server.create_database()
    db = uri.rsplit("/", 1)[1]
    postgres_server.execute(DDL, db)
    postgres_server.execute(
        "INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu) VALUES ('10.0.0.7:1', 1, 1, 1)", db)
    role, password = f"r_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    postgres_server.create_role(role, password)
    postgres_server.execute(f'GRANT CONNECT ON DATABASE "{db}" TO "{role}"')
    postgres_server.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"', db)
    for table in READ_TABLES:
        postgres_server.execute(f'GRANT SELECT ON {table} TO "{role}"', db)
    yield Curio(postgres_server, db), postgres_server.uri(db, role, password)


def _fleet(tmp_path: Path, curio: Curio, url: str, *, spec: str = SPEC, desired: int = 3,
           rates: tuple[float, ...] = (4800.0, 2400.0, 3600.0)) -> tuple[Loop, World]:
    start = datetime.now(UTC).replace(microsecond=0)
    loop = Loop(tmp_path, spec, capacity_line(desired, list(range(len(rates))), start - timedelta(hours=1)), url)
    world = World(loop.store, loop.clock, curio)
    for i, rate in enumerate(rates):
        world.start(f"rtx4090-{i}-{'abcdef'[i] * 6}", f"rtx4090-{i}", rate)
    return loop, world


def test_fleet_wide_silence_and_an_unreachable_queue_change_no_count_and_status_says_why(
        tmp_path: Path, curio_db: tuple[Curio, str], capsys: pytest.CaptureFixture[str]) -> None:
    curio, url = curio_db
    loop, world = _fleet(tmp_path, curio, url)
    try:
        world.busy(False)
        loop.passes(3, world)  # admission verdicts; idle for 6 s: no shrink yet (the 30 s window is not idle)
        assert loop.trailers() == []
        world.silent = True  # every worker silent: the controller's outage or a partition
        loop.passes(30, world)  # 60 s: twice lost_after
        assert loop.trailers() == [] and loop.capacity()["desired"] == 3 and loop.capacity()["draining"] == []
        last = loop.last()
        assert last["held_by"] == "fleet-unheard" and last["note"].startswith(
            "held at 3: the controller has heard no worker for ")
        assert "(> lost_after 0.5 min): its own outage or a partition, not idleness; every count holds" in last["note"]
        assert not any(v.verdict == "lost" for r in loop.results for v in r.verdicts)  # one meaning of heard
        assert main(["status", "--workdir", str(loop.workdir), "--controller-db", str(loop.db)]) == 0
        assert "      now: held at 3: the controller has heard no worker for " in capsys.readouterr().out
        # The fleet comes back (queued heartbeats arrive together): still held while it is coming back.
        world.silent = False
        loop.passes(5, world)
        assert loop.trailers() == [] and loop.last()["held_by"] in ("fleet-unheard", "missing-data")
        # Heard for long enough, idle for the whole window: positive evidence, so it shrinks by draining.
        loop.passes(30, world)
        assert loop.trailers() and loop.trailers()[0].startswith("rtx4090 3 -> 1 (utilization 0.00 over 30 s")
        assert loop.directive("rtx4090-1-bbbbbb") == "drain" and loop.directive("rtx4090-2-cccccc") == "drain"
        assert loop.directive("rtx4090-0-aaaaaa") == "serve"  # the best $/proof machine stays
    finally:
        loop.close()


def test_an_unreachable_queue_changes_no_count(tmp_path: Path, curio_db: tuple[Curio, str]) -> None:
    curio, _ = curio_db
    unreachable = "postgresql://reader:secret-pw@127.0.0.1:9/curio"  # discard port: nothing listens
    loop, world = _fleet(tmp_path, curio, unreachable)
    try:
        world.busy(False)
        loop.passes(25, world)
        assert loop.trailers() == [] and loop.capacity()["desired"] == 3
        last = loop.last()
        assert last["held_by"] == "missing-data" and last["note"].startswith(
            "held: curio's queue could not be read (OperationalError: ")
        assert last["note"].endswith("a pool never shrinks on missing data") and "secret-pw" not in last["note"]
    finally:
        loop.close()


def test_a_queue_that_flickers_faster_than_the_window_moves_nothing(tmp_path: Path,
                                                                     curio_db: tuple[Curio, str]) -> None:
    """Bursts of 20 PoRep tasks every 6 s, each claimed within 2.5 s (none waits the 15 s window); the machines
    busy every other heartbeat. The issue saw 1 -> 2 -> 3 (and 3 -> 2) from this."""
    curio, url = curio_db
    loop, world = _fleet(tmp_path, curio, url, desired=2, rates=(3600.0, 2400.0))
    try:
        state = {"burst": None}

        def flicker(now: datetime) -> None:
            if state["burst"] is None or now - state["burst"] >= timedelta(seconds=6):
                curio.post("PoRep", 20, now)
                state["burst"] = now
            elif now - state["burst"] >= timedelta(seconds=2.5):
                curio.claim_all("PoRep")

        world.on_tick.append(flicker)
        for w in world.workers.values():
            w["busy"] = lambda now: int(now.timestamp() // BEAT_S) % 2 == 0
        loop.passes(75, world)  # 150 s: ten up windows, five down windows
        assert loop.trailers() == [], loop.trailers()
        seen = [r.to_json()["capacity"][0]["signals"]["queue"]["waiting"]["PoRep"] for r in loop.results]
        assert max(seen) >= 20 and min(seen) == 0  # the passes did see the bursts, and their absence
        assert loop.last()["note"].startswith("steady at 2")
    finally:
        loop.close()


def test_a_lowered_max_drains_the_worst_usd_per_proof_machine_mid_proof(tmp_path: Path,
                                                                        curio_db: tuple[Curio, str]) -> None:
    """Three machines busy mid-proof at 4,800, 2,400 and 3,600 proofs/h; a human lowers max to 2: the 2,400/h
    machine (slot 1, not the highest slot) drains and finishes its proofs; nothing is stopped."""
    curio, url = curio_db
    loop, world = _fleet(tmp_path, curio, url)
    try:
        loop.passes(3, world)
        human_commit(loop.human, {"fleet-spec/fleet.yaml": SPEC.replace("max: 6}", "max: 2}")}, "lower max to 2")
        loop.passes(2, world)
        (trailer,) = loop.trailers()
        assert trailer.startswith("rtx4090 3 -> 2 (bounds 1..2 in fleet.yaml lowered the count: a human's decision; "
                                  "draining rtx4090-1 ($0.0002/proof))")
        assert loop.capacity()["slots"] == [0, 1, 2] and loop.capacity()["draining"] == [1]
        assert [loop.directive(f"rtx4090-{i}-{c * 6}") for i, c in enumerate("abc")] == ["serve", "drain", "serve"]
        loop.passes(5, world)  # still proving: its slot stays
        assert loop.capacity()["slots"] == [0, 1, 2]
        world.stop("rtx4090-1-bbbbbb")
        loop.passes(2, world)
        assert loop.trailers()[-1] == "rtx4090 released rtx4090-1 (drained: nothing proves there any more)"
        assert loop.capacity()["slots"] == [0, 2] and loop.capacity()["draining"] == []
    finally:
        loop.close()


def test_a_pin_drains_like_any_shrink_and_status_shows_its_own_time_and_reason(
        tmp_path: Path, curio_db: tuple[Curio, str], capsys: pytest.CaptureFixture[str]) -> None:
    curio, url = curio_db
    loop, world = _fleet(tmp_path, curio, url)
    try:
        loop.passes(3, world)
        human_commit(loop.human, {"fleet-spec/fleet.yaml": SPEC.replace("min: 1, max: 6", "min: 2, max: 2")}, "pin")
        loop.passes(2, world)
        pinned_at = loop.capacity()["changed_at"]
        assert loop.trailers() == ["rtx4090 3 -> 2 (min == max = 2 (a pin) in fleet.yaml lowered the count: a human's "
                                   "decision; draining rtx4090-1 ($0.0002/proof))"]
        assert loop.directive("rtx4090-1-bbbbbb") == "drain"
        loop.passes(3, world)
        assert main(["status", "--workdir", str(loop.workdir), "--controller-db", str(loop.db)]) == 0
        out = capsys.readouterr().out
        assert (f"      last change down at {pinned_at}: min == max = 2 (a pin) in fleet.yaml lowered the count: a "
                "human's decision; draining rtx4090-1") in out
        assert "      now: pinned at 2 (min == max in fleet.yaml)" in out
    finally:
        loop.close()


def test_market_work_grows_the_pool_only_while_it_pays(tmp_path: Path, curio_db: tuple[Curio, str]) -> None:
    """curio queues PSProve tasks whenever its own queue is idle. Paying (0.0001 FIL = $0.0004 a proof against the
    pool's $0.0002): waiting ones that lasted grow the pool. Then the market pays less than the cost: the machines
    busy on it count as idle and the pool shrinks, worst $/proof first."""
    curio, url = curio_db
    loop, world = _fleet(tmp_path, curio, url, spec=MARKET_SPEC, desired=2, rates=(3600.0, 2400.0))
    try:
        for i in (0, 1):
            curio.node(f"10.1.0.{i}:12300", f"rtx4090-{i}-{'ab'[i] * 6}")
        for nonce, cumulative in enumerate((0, 100, 200, 300)):  # three paid proofs of 0.0001 FIL
            curio.sql("INSERT INTO proofshare_provider_payments (provider_id, request_cid, payment_nonce, "  # noqa: S608
                      f"payment_cumulative_amount, payment_signature) VALUES (1001, 'b{nonce}', {nonce}, "
                      f"'{cumulative * FIL // 1_000_000}', '\\x00')")
        now = loop.clock()
        curio.post("PSProve", 2, now, owner="10.1.0.0:12300")
        curio.post("PSProve", 1, now, owner="10.1.0.1:12300")
        curio.post("PSProve", 8, now)  # waiting market work: the high-water of curio's requests
        loop.passes(12, world)  # 24 s: the waiting ones waited the 15 s window
        assert loop.trailers() and loop.trailers()[0].startswith(
            "rtx4090 2 -> ") and "waiting Snark Market tasks has waited" in loop.trailers()[0]
        grown = loop.capacity()["desired"]
        market = loop.last()["signals"]["market"]
        assert market["paying"] and market["served"] == 3 and market["revenue_usd_per_proof"] == 0.0004
        # The market now pays 0.00001 FIL a proof ($0.00004 < cost): its work is no demand, however busy.
        for nonce in range(4, 14):
            curio.sql("INSERT INTO proofshare_provider_payments (provider_id, request_cid, payment_nonce, "  # noqa: S608
                      f"payment_cumulative_amount, payment_signature) VALUES (1001, 'b{nonce}', {nonce}, "
                      f"'{(300 + 10 * (nonce - 3)) * FIL // 1_000_000}', '\\x00')")
        curio.sql("DELETE FROM proofshare_provider_payments WHERE payment_nonce BETWEEN 1 AND 3")
        curio.sql("UPDATE harmony_task SET posted_time = now() WHERE name = 'PSProve'")
        loop.passes(40, world)
        shrink = [t for t in loop.trailers() if t.startswith(f"rtx4090 {grown} -> ") or " -> 1 " in t]
        assert any("machines on unpaid Snark Market work" in t for t in shrink), loop.trailers()
        assert loop.capacity()["desired"] < grown
        assert not loop.last()["signals"]["market"]["paying"]
    finally:
        loop.close()


def test_a_machine_that_misses_market_deadlines_gets_a_serving_verdict(tmp_path: Path,
                                                                         curio_db: tuple[Curio, str]) -> None:
    curio, url = curio_db
    loop, world = _fleet(tmp_path, curio, url, spec=MARKET_SPEC, desired=2, rates=(3600.0, 2400.0))
    try:
        curio.node("10.1.0.1:12300", "rtx4090-1-bbbbbb")
        loop.passes(2, world)
        now = loop.clock()
        for task, minutes in ((501, 3), (502, 2)):  # two PSProve runs that ended past the 1 min deadline
            posted = (now - timedelta(minutes=minutes)).isoformat()
            curio.sql("INSERT INTO harmony_task_history (task_id, name, posted, work_start, work_end, result, "  # noqa: S608
                      f"completed_by_host_and_port, err) VALUES ({task}, 'PSProve', '{posted}', '{posted}', "
                      f"'{now.isoformat()}', TRUE, '10.1.0.1:12300', '')")
        loop.passes(2, world)
        verdicts = [v for r in loop.results for v in r.verdicts if v.verdict == "market-deadline"]
        assert [(v.instance_id, v.blame, v.marks_bad) for v in verdicts] == [("rtx4090-1-bbbbbb", "machine", True)]
        record = origin_file(loop.origin, "fleet-spec/machines/m-rtx4090-1-bbbbbb.yaml") or ""
        assert '"verdict": "market-deadline"' in record and "missed the Snark Market's 1 min deadline 2 times" in record
        assert loop.directive("rtx4090-1-bbbbbb") == "stop" and loop.directive("rtx4090-0-aaaaaa") == "serve"
    finally:
        loop.close()
