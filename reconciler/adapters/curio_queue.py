"""curio's task queue: waiting and running proof tasks per type, read from its harmony_task table.

Place in the flow: the leader's pass reads it for each autoscaled pool with a `queue:` source and hands the
snapshot to `domain.capacity` (demand signal next to utilization). curio keeps its tasks in the cluster's
YugabyteDB; YSQL speaks the PostgreSQL protocol, so psycopg reaches it, with a read-only role (a
`SELECT` grant on harmony_task is all it needs) in a read-only transaction.

Schema (filecoin-project/curio at e0294b0f948132d41e8f42f59fa949495d5fd3af):
harmony/harmonydb/sql/20230719-harmony.sql creates `harmony_task (id, initiated_by, update_time, posted_time,
owner_id REFERENCES harmony_machines, added_by, previous_task, name varchar(16))`, with the comment
"owner_id ... may be null if between owners or not yet taken"; 20240522-ts-to-timestampz.sql makes
posted_time/update_time TIMESTAMPTZ; 20240927-task-retrywait.sql adds `retries`. curio's own scheduler polls
`... FROM harmony_task WHERE owner_id IS NULL AND name = ANY($1)` (harmony/harmonytask/scheduler.go), and
20260112-pdp-v0-efficiency-indexes.sql indexes exactly that (`ON harmony_task (name, update_time) WHERE
owner_id IS NULL`): the count below is the same question.

Any failure (unreachable, refused, no URL, no table) is returned as the snapshot's `error`, never raised:
the pool then runs on utilization alone and never shrinks (domain.capacity).

Snark Market (a pool with `queue.market`; domain/snark_market.py cites how curio runs it), read in the same
read-only session, each part on its own so that a role without the market's grants still reads the queue:
`PSProve` rows of harmony_task (waiting, running, and those running past the market's deadline, with the curio
node that holds them), harmony_task_history (runs that failed or ended past the deadline,
20230719-harmony.sql + 20231113-harmony_taskhistory_oops.sql: `completed_by_host_and_port`), the node's name
in harmony_machine_details (20240404-machine_detail.sql + 20240527-machine_name.sql; the worker runs curio
with CURIO_NODE_NAME = its instance id), the provider's payments (20250115-proofshare.sql
`proofshare_provider_payments`: one proof's pay is its cumulative amount minus the previous nonce's, as
curio's UI computes it in web/api/webrpcporep/proofshare.go PSListQueue) and its asked price
(`proofshare_meta.pprice`, attoFIL). Times are the database's own (`now()`): curio writes them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from reconciler.domain.capacity import QueueSnapshot
from reconciler.domain.redact import redact_line
from reconciler.domain.snark_market import MarketMiss, MarketSnapshot
from reconciler.domain.spec import MarketSource, QueueSource

#: Waiting (unclaimed) and running (claimed) tasks per name, and the oldest waiting one's posting time.
QUEUE_QUERY = """
SELECT name,
       count(*) FILTER (WHERE owner_id IS NULL) AS waiting,
       count(*) FILTER (WHERE owner_id IS NOT NULL) AS running,
       min(posted_time) FILTER (WHERE owner_id IS NULL) AS oldest_waiting
  FROM harmony_task
 WHERE name = ANY(%s)
 GROUP BY name
"""

#: Sealing sectors whose precommit landed, not failed, with no PoRep task yet: each gets one once its seed is on
#: chain (curio harmony/harmonydb/sql/20231217-sdr-pipeline.sql: sectors_sdr_pipeline.after_precommit_msg_success,
#: task_id_porep, after_porep, failed; tasks/seal/poller_precommit_msg.go sets seed_epoch = precommit epoch +
#: PreCommitChallengeDelay). A leading indicator of PoRep demand: read only for pools counting PoRep.
UPCOMING_POREP_QUERY = """
SELECT count(*)
  FROM sectors_sdr_pipeline
 WHERE after_precommit_msg_success AND NOT after_porep AND task_id_porep IS NULL AND NOT failed
"""

#: Paid proofs within the window and their pay together (attoFIL, as text: amounts pass 2^63).
PAYMENTS_QUERY = """
SELECT count(*),
       coalesce(sum(p.payment_cumulative_amount::numeric - prev.payment_cumulative_amount::numeric), 0)::text
  FROM proofshare_provider_payments p
  JOIN proofshare_provider_payments prev
    ON prev.provider_id = p.provider_id AND prev.payment_nonce = p.payment_nonce - 1
 WHERE p.created_at >= now() - make_interval(secs => %s)
"""

ASKED_PRICE_QUERY = "SELECT pprice FROM proofshare_meta WHERE singleton"

#: Market runs that missed the deadline within the window: failed, or ended later than the deadline after they
#: were posted; with the name of the curio node that ran them.
MISSED_RUNS_QUERY = """
SELECT h.task_id, node.machine_name, h.completed_by_host_and_port, h.posted, h.work_end, h.result, h.err
  FROM harmony_task_history h
  LEFT JOIN LATERAL (
       SELECT d.machine_name FROM harmony_machines m JOIN harmony_machine_details d ON d.machine_id = m.id
        WHERE m.host_and_port = h.completed_by_host_and_port ORDER BY m.id DESC LIMIT 1) node ON true
 WHERE h.name = ANY(%s) AND h.work_end >= now() - make_interval(secs => %s)
   AND (NOT h.result OR h.work_end - h.posted > make_interval(secs => %s))
 ORDER BY h.work_end DESC
 LIMIT 1000
"""

#: Market tasks a curio node holds past the deadline (still running: timing out on it).
OVERDUE_QUERY = """
SELECT t.id, d.machine_name, m.host_and_port, t.posted_time, now()
  FROM harmony_task t
  JOIN harmony_machines m ON m.id = t.owner_id
  LEFT JOIN harmony_machine_details d ON d.machine_id = m.id
 WHERE t.name = ANY(%s) AND t.owner_id IS NOT NULL AND t.posted_time < now() - make_interval(secs => %s)
 LIMIT 1000
"""

_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]+:)[^@\s]+@")


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {_clean(str(exc)) or 'no message'}"


def _aware(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"expected a timestamp, got {type(value).__name__}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _atto(text: Any) -> int | None:
    """proofshare_meta.pprice (attoFIL as text); None when unset, zero or not a number."""
    try:
        value = int(Decimal(str(text)))
    except (InvalidOperation, ValueError):
        return None
    return value if value > 0 else None


def _counts(rows: Sequence[tuple[Any, ...]], kinds: Sequence[str]) -> tuple[dict[str, int], dict[str, int],
                                                                            datetime | None]:
    """Waiting and running per task type (every type named, 0 without rows) and the oldest waiting one."""
    waiting = {kind: 0 for kind in kinds}
    running = {kind: 0 for kind in kinds}
    oldest: datetime | None = None
    for name, n_waiting, n_running, first in rows:
        waiting[name] = int(n_waiting)
        running[name] = int(n_running)
        if isinstance(first, datetime):
            first = _aware(first)
            oldest = first if oldest is None else min(oldest, first)
    return waiting, running, oldest


def _clean(message: str) -> str:
    """One line, the password of a URL in it masked, then the fleet's redaction."""
    text = " ".join(message.split())
    return redact_line(_URL_PASSWORD.sub(r"\1***@", text))[:300]


class CurioQueue:
    """Reads the queue a pool's `queue:` names; the URL comes from the environment variable it names."""

    def __init__(self, environ: Mapping[str, str] | None = None, connect_timeout_s: float = 5.0,
                 statement_timeout_ms: int = 5000):
        self._environ = environ if environ is not None else os.environ
        self._connect_timeout_s = connect_timeout_s
        self._statement_timeout_ms = statement_timeout_ms

    def read(self, source: QueueSource) -> QueueSnapshot:
        url = self._environ.get(source.url_env, "").strip()
        if not url:
            return QueueSnapshot(error=f"${source.url_env} is not set (the queue's postgresql:// URL)")
        try:
            import psycopg
        except ImportError:  # pragma: no cover - a dependency of the package
            return QueueSnapshot(error="psycopg is not installed")
        try:
            with psycopg.connect(url, connect_timeout=max(1, int(self._connect_timeout_s)), autocommit=False,
                                 options=f"-c statement_timeout={self._statement_timeout_ms}") as conn:
                conn.read_only = True
                market_types = list(source.market.task_types) if source.market is not None else []
                with conn.cursor() as cur:
                    cur.execute(QUEUE_QUERY, ([*source.task_types, *market_types],))
                    rows = cur.fetchall()
                conn.rollback()
                upcoming = self._upcoming(conn) if "PoRep" in source.task_types else None
                market = self._market(conn, source.market, rows) if source.market is not None else None
        except psycopg.Error as exc:
            return QueueSnapshot(error=_error(exc))
        except OSError as exc:
            return QueueSnapshot(error=f"{type(exc).__name__}: {_clean(str(exc))}")
        own = [row for row in rows if row[0] in source.task_types]
        waiting, running, oldest = _counts(own, source.task_types)
        return QueueSnapshot(waiting, running, oldest, upcoming=upcoming, market=market)

    @staticmethod
    def _market(conn: Any, market: MarketSource, rows: Sequence[tuple[Any, ...]]) -> MarketSnapshot:
        """The market's tasks (from the queue's rows), pay, asked price and missed deadlines; an unreadable part
        makes the snapshot's error (the market then counts as not paying), never the queue's."""
        import psycopg

        waiting, running, oldest = _counts([r for r in rows if r[0] in market.task_types], market.task_types)
        window_s = market.window_hours * 3600.0
        deadline_s = market.deadline_minutes * 60.0
        try:
            with conn.cursor() as cur:
                cur.execute(PAYMENTS_QUERY, (window_s,))
                paid, paid_atto = cur.fetchone() or (0, "0")
                cur.execute(ASKED_PRICE_QUERY)
                asked_row = cur.fetchone()
                cur.execute(MISSED_RUNS_QUERY, (list(market.task_types), window_s, deadline_s))
                missed = cur.fetchall()
                cur.execute(OVERDUE_QUERY, (list(market.task_types), deadline_s))
                overdue = cur.fetchall()
            conn.rollback()
        except psycopg.Error as exc:
            conn.rollback()
            return MarketSnapshot(sum(waiting.values()), sum(running.values()), oldest, error=_error(exc))
        misses = [MarketMiss(int(task), name, str(host), _aware(posted), _aware(end), bool(ok),
                             _clean(err) if isinstance(err, str) and err else None)
                  for task, name, host, posted, end, ok, err in missed]
        misses += [MarketMiss(int(task), name, str(host), _aware(posted), _aware(end), False, None, overdue=True)
                   for task, name, host, posted, end in overdue]
        return MarketSnapshot(sum(waiting.values()), sum(running.values()), oldest, int(paid),
                              int(Decimal(str(paid_atto))), _atto(asked_row[0] if asked_row else None), tuple(misses))

    @staticmethod
    def _upcoming(conn: Any) -> int | None:
        """Sectors past precommit; None when the role may not read the pipeline (the queue still counts)."""
        import psycopg

        try:
            with conn.cursor() as cur:
                cur.execute(UPCOMING_POREP_QUERY)
                row = cur.fetchone()
            conn.rollback()
        except psycopg.Error:
            conn.rollback()
            return None
        return int(row[0]) if row else None
