"""`FleetStatus.to_json` is `asdict` of the view (field by field, so a fleet's thousands of flat rows are not
deep-copied), with each instance's root cause first and its timeline as a mapping."""

from __future__ import annotations

from dataclasses import asdict

from reconciler.domain.judging import decide
from reconciler.domain.records import RecordSet
from reconciler.domain.status import status_view
from tests.html_support import FIRST, NOW, RUNNING, SECOND, SLOW
from tests.scenarios import DIGEST, SPEC


def test_to_json_is_asdict_with_the_root_cause_first() -> None:
    decided = decide(SPEC, [FIRST, SECOND, SLOW], RecordSet(), set(), DIGEST, NOW)
    records = RecordSet(decided.machine_records, decided.image_records)
    view = status_view(SPEC, records, [FIRST, SECOND, SLOW, RUNNING], NOW, desired_image_digest=DIGEST)
    assert view.bad_machines and view.rates and view.suspects and view.instances
    expected = asdict(view)
    expected["instances"] = [{"root_cause": i.root_cause, **asdict(i), "timeline": dict(i.timeline)}
                             for i in view.instances]
    got = view.to_json()
    assert got == expected and list(got) == list(expected)
    assert all(next(iter(i)) == "root_cause" for i in got["instances"])
