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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from reconciler.domain.capacity import QueueSnapshot
from reconciler.domain.redact import redact_line
from reconciler.domain.spec import QueueSource

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

_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]+:)[^@\s]+@")


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
                with conn.cursor() as cur:
                    cur.execute(QUEUE_QUERY, (list(source.task_types),))
                    rows = cur.fetchall()
                conn.rollback()
                upcoming = self._upcoming(conn) if "PoRep" in source.task_types else None
        except psycopg.Error as exc:
            kind = type(exc).__name__
            return QueueSnapshot(error=f"{kind}: {_clean(str(exc)) or 'no message'}")
        except OSError as exc:
            return QueueSnapshot(error=f"{type(exc).__name__}: {_clean(str(exc))}")
        waiting = {kind: 0 for kind in source.task_types}
        running = {kind: 0 for kind in source.task_types}
        oldest: datetime | None = None
        for name, n_waiting, n_running, first in rows:
            waiting[name] = int(n_waiting)
            running[name] = int(n_running)
            if isinstance(first, datetime):
                first = first if first.tzinfo is not None else first.replace(tzinfo=UTC)
                oldest = first if oldest is None else min(oldest, first)
        return QueueSnapshot(waiting, running, oldest, upcoming=upcoming)

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
