"""Fleet spec files: load `fleet-spec/fleet.yaml` (and the owned-hosts inventory `hosts.yaml` beside it), validate
them (JSON Schema + semantic checks, then the two together), freeze them.

First step of every flow (`fleet validate`, `plan`, `apply`, `reconcile`, the Pulumi program): nothing
downstream reads YAML. Validation reports every problem at once, each naming the file, the line, the
JSON path, the bad value and what was expected; a bad spec is a permanent error that stalls the loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from reconciler import SCHEMA_DIR
from reconciler.adapters.cache_files import cache_file
from reconciler.adapters.capacity_files import capacity_path, load_capacity
from reconciler.adapters.yaml_library import yaml_library
from reconciler.domain.capacity import apply_entries
from reconciler.domain.exposure import controller_url_warning
from reconciler.domain.gpus import KNOWN_GPU_MODELS
from reconciler.domain.hosts import DockerTls, HostSelector, OwnedHost
from reconciler.domain.spec import (
    MARKET_TASK_TYPES,
    PROOF_TASK_TYPES,
    TASK_TYPE_OF_PROOF,
    BenchmarkSettings,
    CircuitBreakerSettings,
    ControllerSettings,
    EarlyVerdictSettings,
    FleetSpec,
    ImageSettings,
    KillBudgetSettings,
    MarketSource,
    NotificationSettings,
    ParamsSettings,
    PoolSpec,
    QueueSource,
    RecordExpirySettings,
    RetestSettings,
    ScalingSettings,
    ServingSettings,
    SpecError,
    SpecProblem,
    WebhookSettings,
)
from reconciler.domain.workload import GIB_IN_GB, ram_shortfall

if TYPE_CHECKING:
    import jsonschema
    import yaml

# PyYAML and jsonschema are imported where they are used: a command whose spec is unchanged since it was last
# validated (load_spec_cached) imports neither (~0.1 s of a read-only command's start).

SPEC_SCHEMA_PATH = SCHEMA_DIR / "fleet.schema.json"
HOSTS_SCHEMA_PATH = SCHEMA_DIR / "hosts.schema.json"
HOSTS_FILE = "hosts.yaml"


# --- loading -------------------------------------------------------------------------------------------


@cache
def _spec_validator() -> jsonschema.Draft202012Validator:
    return strict_validator(json.loads(SPEC_SCHEMA_PATH.read_text()))


def strict_validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """A Draft 2020-12 validator for `schema` in which 1.0 is not an integer."""
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)
    # JSON Schema counts 1.0 as an integer; a slot count of 1.0 would then break range() downstream.
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    strict = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)
    return strict(schema)


def _line_index(node: yaml.Node, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], int]]:
    """Map every JSON path in a composed YAML tree to its 1-based line number."""
    import yaml

    yield path, node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            yield (*path, key), key_node.start_mark.line + 1
            for sub_path, line in _line_index(value_node, (*path, key)):
                if sub_path != (*path, key):
                    yield sub_path, line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _line_index(item, (*path, i))


def format_json_path(path: Iterable[Any]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):  # YAML keys JSON cannot hold (a date, a list: `2026-12-02: `): say what it is
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _schema_properties(error: jsonschema.ValidationError) -> set[str]:
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    return set(schema.get("properties", {}))


def _describe(error: jsonschema.ValidationError) -> str:
    """A sentence saying what was found and what is expected, without jsonschema's repr noise."""
    v = error.validator
    kw: Any = error.validator_value
    instance: Any = error.instance
    got = _short(instance)
    if kw is None:
        return error.message
    if v == "required":
        missing = [k for k in kw if isinstance(instance, dict) and k not in instance]
        return f"missing required field(s): {', '.join(missing)}"
    if v == "additionalProperties":
        extra = sorted(map(str, set(instance) - _schema_properties(error)))
        allowed = ", ".join(sorted(_schema_properties(error)))
        return f"unknown field(s) {', '.join(extra)}; allowed: {allowed}"
    if v == "type":
        return f"got {got}, expected a value of type {kw}"
    if v in ("oneOf", "anyOf"):  # every branch refused it by type (see _specific): name the types
        kinds = [str(e.validator_value) for e in error.context or () if e.validator == "type"]
        return f"got {got}, expected a value of type {' or '.join(dict.fromkeys(kinds))}"
    if v == "enum":
        return f"got {got}, expected one of {', '.join(map(str, kw))}"
    if v == "const":
        return f"got {got}, expected {kw!r}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        return f"got {got}, expected a number {op} {kw}"
    if v == "pattern":
        return f"got {got}, expected text matching {kw}"
    if v in ("minLength", "minItems"):
        return f"got {got}, expected at least {kw} {'character' if v == 'minLength' else 'item'}(s)"
    return f"got {got}: {error.message}"


def _specific(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For `count: 2 | {min, max}` (oneOf): the branch of the value's own type says what is wrong with it."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        of_type = [e for e in error.context if e.validator != "type"]
        if of_type:
            return _specific(min(of_type, key=lambda e: len(e.absolute_path)))
    return error


def _problem_path(error: jsonschema.ValidationError) -> tuple[Any, ...]:
    path = tuple(error.absolute_path)
    instance: Any = error.instance
    # For an unknown key, point at the key itself so the line number lands on it.
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        extra = sorted(set(instance) - _schema_properties(error), key=str)
        if extra:
            return (*path, extra[0])
    return path


def _semantic_problems(doc: dict[str, Any], file: str, lines: dict[tuple[Any, ...], int]) -> list[SpecProblem]:
    """Checks JSON Schema cannot express. Tolerates a schema-invalid document (skips what it cannot read)
    so that one run reports schema and semantic problems together."""
    problems: list[SpecProblem] = []

    def add(path: tuple[Any, ...], message: str, severity: str = "error") -> None:
        problems.append(SpecProblem(file, format_json_path(path), message, lines.get(path), severity))

    controller: dict[str, Any] = doc["controller"] if isinstance(doc.get("controller"), dict) else {}
    if isinstance(controller.get("url"), str) and (clear := controller_url_warning(controller["url"])) is not None:
        add(("controller", "url"), clear, "warning")
    # .nan passes every JSON Schema bound (all comparisons are false); .inf makes a rate unreachable.
    for path, value in _leaves(doc):
        if isinstance(value, float) and not math.isfinite(value):
            add(path, f"got {value}, expected a finite number")

    pools = doc.get("pools")
    priors: dict[str, Any] = doc["gpu_priors"] if isinstance(doc.get("gpu_priors"), dict) else {}
    seen: dict[str, int] = {}
    for i, pool in enumerate(pools if isinstance(pools, list) else []):
        if not isinstance(pool, dict):
            continue
        name = pool.get("name")
        if isinstance(name, str):
            if name in seen:
                add(("pools", i, "name"), f"duplicate pool name {name!r} (first at $.pools[{seen[name]}])")
            else:
                seen[name] = i
        rate = pool.get("min_rate_proofs_per_hour")
        if isinstance(rate, int | float) and not isinstance(rate, bool) and rate <= 0:
            add(("pools", i, "min_rate_proofs_per_hour"),
                f"got {rate}, expected a rate > 0 proofs/hour (0 would keep machines that never prove)")
        gpu = pool.get("gpu_name")
        if isinstance(gpu, str) and gpu not in KNOWN_GPU_MODELS and gpu not in priors:
            add(("pools", i, "gpu_name"),
                f"GPU model {gpu!r} is not known to the ranking priors; check the spelling "
                f"against the marketplace (known: {', '.join(sorted(KNOWN_GPU_MODELS))}) or add it under "
                "gpu_priors", "warning")
        bench: dict[str, Any] = pool["benchmark"] if isinstance(pool.get("benchmark"), dict) else {}
        _capacity_problems(pool, i, bench, doc.get("max_total_dph"), add)
        conc, proofs = bench.get("concurrency", 2), bench.get("proofs", 10)
        if isinstance(conc, int) and isinstance(proofs, int) and conc > proofs:
            add(("pools", i, "benchmark", "concurrency"),
                f"got {conc}, expected at most benchmark.proofs ({proofs}): extra jobs would sit idle")
        # Plan-time refusal: a pool whose machines cannot hold its own workload (cuzk would block on its
        # memory budget or be OOM-killed on every machine rented, and the verdicts would blame them).
        ram, proof_type = pool.get("min_host_ram_gb", 128), bench.get("proof_type", "porep")
        # (Not while concurrency itself is refused above: one problem, one line.)
        if isinstance(ram, int) and isinstance(conc, int) and isinstance(proof_type, str) and not (
                isinstance(proofs, int) and conc > proofs):
            why = ram_shortfall(ram, proof_type, conc)
            if why is not None:
                add(("pools", i, "min_host_ram_gb"), f"got {ram}: {why}")
        budget = bench.get("memory_budget_gib")
        if isinstance(budget, int) and isinstance(ram, int) and budget * GIB_IN_GB > ram:
            add(("pools", i, "benchmark", "memory_budget_gib"),
                f"got {budget} GiB, more than the pool's min_host_ram_gb ({ram} GB): the daemon would overcommit")
    serving: dict[str, Any] = doc["serving"] if isinstance(doc.get("serving"), dict) else {}
    heartbeat, lost = serving.get("heartbeat_minutes", 5.0), serving.get("lost_after_minutes", 20.0)
    if _is_number(heartbeat) and _is_number(lost) and lost < 2 * heartbeat:
        add(("serving", "lost_after_minutes"),
            f"got {lost}, expected at least 2 x serving.heartbeat_minutes ({heartbeat}): one late heartbeat "
            "would make a machine lost")
    window, after = serving.get("window_minutes", 60.0), serving.get("degraded_after_minutes", 30.0)
    if _is_number(window) and _is_number(heartbeat) and window < 2 * heartbeat:
        add(("serving", "window_minutes"),
            f"got {window}, expected at least 2 x serving.heartbeat_minutes ({heartbeat}): a window needs two "
            "heartbeats to measure a rate")
    if _is_number(after) and _is_number(heartbeat) and 0 < after < heartbeat:
        add(("serving", "degraded_after_minutes"),
            f"got {after}, expected at least serving.heartbeat_minutes ({heartbeat}): a single heartbeat would "
            "be a verdict", "warning")
    notifications: dict[str, Any] = doc["notifications"] if isinstance(doc.get("notifications"), dict) else {}
    hooks: list[Any] = notifications["webhooks"] if isinstance(notifications.get("webhooks"), list) else []
    named: dict[str, int] = {}
    for i, hook in enumerate(hooks):
        name = hook.get("name") if isinstance(hook, dict) else None
        if isinstance(name, str):
            if name in named:
                add(("notifications", "webhooks", i, "name"),
                    f"webhook {name!r} is named twice (also webhooks[{named[name]}]); names must be unique")
            named.setdefault(name, i)
    cap = doc.get("max_total_dph")
    if isinstance(cap, int | float) and not isinstance(cap, bool) and cap > 0 and isinstance(pools, list):
        worst = lowest = 0.0
        cheapest: float | None = None
        for pool in pools:
            if not isinstance(pool, dict):
                continue
            count, price = pool.get("count"), pool.get("max_price_usd_per_hour")
            if isinstance(count, dict):  # autoscaled: the worst case is its max; its min must fit for sure
                lowest += count["min"] * price if _is_number(count.get("min")) and _is_number(price) else 0
                count = count.get("max")
            if isinstance(count, int) and isinstance(price, int | float) and not isinstance(price, bool):
                worst += count * price
                cheapest = price if cheapest is None else min(cheapest, price)
        if cheapest is not None and cap < cheapest:
            add(("max_total_dph",), f"got {cap}, below every pool's max_price_usd_per_hour (lowest {cheapest}): "
                "the cap would refuse every create")
        elif lowest > cap + 1e-9:
            add(("max_total_dph",), f"got {cap}, below what the autoscaled pools cost at their min (count.min x "
                f"max price: ${lowest:.2f}/h): the pools could never reach their minimum")
        elif worst > cap:
            add(("max_total_dph",), f"the pools may cost up to ${worst:.2f}/h (count x max price) and the cap is "
                f"${cap:.2f}/h: some slots may stay empty (plan and status say which)", "warning")
    return problems


def _capacity_problems(pool: dict[str, Any], i: int, bench: dict[str, Any], cap: Any,
                       add: Callable[..., None]) -> None:
    """count: {min, max}, scaling and queue: bounds in order and within the spend cap, known task types."""
    count = pool.get("count")
    ranged = isinstance(count, dict)
    low, high = (count.get("min"), count.get("max")) if isinstance(count, dict) else (None, None)
    if ranged and isinstance(low, int) and isinstance(high, int) and high < low:
        add(("pools", i, "count", "max"), f"got max {high} < min {low}: the bounds must satisfy min <= max "
            "(min == max pins the count)")
    price = pool.get("max_price_usd_per_hour")
    if isinstance(high, int) and isinstance(cap, int | float) and isinstance(price, int | float) and \
            high * price > cap + 1e-9:
        add(("pools", i, "count", "max"), f"got {high}: {high} x max_price_usd_per_hour ${price:g}/h = "
            f"${high * price:.2f}/h is above the fleet spend cap max_total_dph ${cap:g}/h; lower max to at most "
            f"{int(cap // price)}")
    for key in ("scaling", "queue"):
        if key in pool and not ranged:
            add(("pools", i, key), "has no effect: count is a fixed integer (write count: {min: N, max: M} to "
                "autoscale)", "warning")
    queue: dict[str, Any] = pool["queue"] if isinstance(pool.get("queue"), dict) else {}
    kinds = queue.get("task_types")
    for j, kind in enumerate(kinds if isinstance(kinds, list) else []):
        if isinstance(kind, str) and kind in MARKET_TASK_TYPES:
            add(("pools", i, "queue", "task_types", j),
                f"got {kind!r}: Snark Market work is never the operator's own demand; take it by its price under "
                "queue.market: {task_types: [PSProve], min_margin: 0.2, usd_per_fil: N}")
        elif isinstance(kind, str) and kind not in PROOF_TASK_TYPES:
            add(("pools", i, "queue", "task_types", j),
                f"got {kind!r}, not one of curio's proof task types: {', '.join(PROOF_TASK_TYPES)} (curio "
                "tasks/tasknames/names.go; names are case-sensitive)")
    market: dict[str, Any] = queue["market"] if isinstance(queue.get("market"), dict) else {}
    market_kinds = market.get("task_types")
    for j, kind in enumerate(market_kinds if isinstance(market_kinds, list) else []):
        if isinstance(kind, str) and kind not in MARKET_TASK_TYPES:
            add(("pools", i, "queue", "market", "task_types", j),
                f"got {kind!r}, not one of curio's Snark Market task types: {', '.join(MARKET_TASK_TYPES)} (curio "
                "tasks/proofshare/task_prove.go)")
    if queue and "task_types" not in queue:
        proof_type = bench.get("proof_type", "porep")
        if isinstance(proof_type, str) and proof_type not in TASK_TYPE_OF_PROOF:
            add(("pools", i, "queue", "task_types"), f"missing: benchmark.proof_type {proof_type!r} has no "
                f"default curio task type; name them (one of {', '.join(PROOF_TASK_TYPES)})")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    else:
        yield path, value


def _duplicate_keys(node: yaml.Node, file: str, path: tuple[Any, ...] = ()) -> Iterable[SpecProblem]:
    """YAML loaders keep the last of two equal keys silently; an operator's second `count:` must not win unseen."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in first_line:
                yield SpecProblem(file, format_json_path((*path, key)),
                                  f"duplicate key {key!r} (first at line {first_line[key]}); each key may appear once",
                                  line)
            else:
                first_line[key] = line
            yield from _duplicate_keys(value_node, file, (*path, key))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, file, (*path, i))


def _record_expiry(doc: dict[str, Any]) -> RecordExpirySettings:
    base = RecordExpirySettings()
    return RecordExpirySettings(
        hours_by_blame={**base.hours_by_blame, **doc.get("hours_by_blame", {})},
        hours_by_signature=dict(doc.get("hours_by_signature", {})),
        probation_hours=doc.get("probation_hours", base.probation_hours))


def _build(doc: dict[str, Any], source: str, warnings: list[SpecProblem]) -> FleetSpec:
    pools = tuple(_pool(p) for p in doc["pools"])
    return FleetSpec(
        image=ImageSettings(**doc["image"]),
        controller=ControllerSettings(**doc["controller"]),
        pools=pools,
        params=ParamsSettings(**doc.get("params", {})),
        circuit_breaker=CircuitBreakerSettings(**doc.get("circuit_breaker", {})),
        kill_budget=KillBudgetSettings(**doc.get("kill_budget", {})),
        serving=ServingSettings(**doc.get("serving", {})),
        early_verdict=EarlyVerdictSettings(**doc.get("early_verdict", {})),
        retest=RetestSettings(**doc.get("retest", {})),
        record_expiry=_record_expiry(doc.get("record_expiry", {})),
        gpu_priors=dict(doc.get("gpu_priors", {})),
        notifications=NotificationSettings(webhooks=tuple(
            WebhookSettings(name=w["name"], url_env=w["url_env"], format=w.get("format", "generic"),
                            events=tuple(w.get("events", ())))
            for w in doc.get("notifications", {}).get("webhooks", []))),
        name=str(doc.get("name", "main")),
        max_total_dph=float(doc["max_total_dph"]) if doc.get("max_total_dph") is not None else None,
        source=source,
        warnings=tuple(warnings),
    )


def _pool(p: dict[str, Any]) -> PoolSpec:
    benchmark = BenchmarkSettings(**p.get("benchmark", {}))
    fields = {k: v for k, v in p.items() if k not in ("benchmark", "count", "scaling", "queue", "hosts")}
    if isinstance(p.get("hosts"), dict):
        fields["hosts"] = HostSelector(labels=dict(p["hosts"].get("labels", {})))
    count = p["count"]
    if not isinstance(count, dict):
        return PoolSpec(**fields, count=count, benchmark=benchmark)
    queue = None
    if isinstance(p.get("queue"), dict):
        q = p["queue"]
        kinds = tuple(q.get("task_types") or (TASK_TYPE_OF_PROOF[benchmark.proof_type],))
        market = None
        if isinstance(q.get("market"), dict):
            m = dict(q["market"])
            m["task_types"] = tuple(m.get("task_types") or MARKET_TASK_TYPES)
            market = MarketSource(**m)
        queue = QueueSource(url_env=q["url_env"], task_types=kinds, market=market)
    # Without capacity.yaml the pool starts at its min; load_spec applies the leader's entries.
    return PoolSpec(**fields, count=count["min"], benchmark=benchmark, min_count=count["min"],
                    max_count=count["max"], scaling=ScalingSettings(**p.get("scaling", {})), queue=queue,
                    slot_indices=tuple(range(count["min"])), desired_count=count["min"])


def _first_alias(text: str) -> yaml.AliasEvent | None:
    """The first alias in the text, found by the event parser (linear: nothing is expanded)."""
    yaml, loader, _ = yaml_library()
    return next((event for event in yaml.parse(text, Loader=loader) if isinstance(event, yaml.AliasEvent)), None)


def checked_yaml(text: str, file: str, validator: jsonschema.protocols.Validator, what: str,
                 ) -> tuple[dict[str, Any] | None, dict[tuple[Any, ...], int], list[SpecProblem]]:
    """Parse YAML text and check it against a JSON Schema: (document or None, line of every JSON path, problems).
    The fleet spec and the hosts inventory share it: aliases refused, every schema problem named with its line."""
    yaml, loader, _ = yaml_library()

    try:
        alias = _first_alias(text)
        if alias is not None:
            # Aliases let a few hundred bytes expand into gigabytes (an "alias bomb") in every consumer of
            # the file; a fleet spec has no need for them, so they are refused before anything expands.
            return None, {}, [SpecProblem(file, "$", f"YAML aliases are not allowed in a fleet spec (found "
                                          f"*{alias.anchor}); write the values out",
                                          alias.start_mark.line + 1 if alias.start_mark else None)]
        # One parse for both: the node tree (for the lines) and the document built from it (what `yaml.load` does,
        # without parsing the text a second time).
        parser = loader(text)
        try:
            root = parser.get_single_node()
            doc = parser.construct_document(root) if root is not None else None
        finally:
            parser.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(exc, "problem", None) or str(exc)
        return None, {}, [SpecProblem(file, "$", f"not valid YAML: {reason}", line)]
    except RecursionError:
        return None, {}, [SpecProblem(file, "$", "not valid YAML: nested too deeply")]
    except (ValueError, IndexError, TypeError, AttributeError, OverflowError) as exc:
        # PyYAML raises these, not YAMLError, for some explicit tags on bad values (`!!int `, `!!float x`).
        return None, {}, [SpecProblem(file, "$", f"not valid YAML: {type(exc).__name__}: {exc}")]
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else type(doc).__name__
        return None, {}, [SpecProblem(file, "$", f"expected a mapping with {what}, got {kind}", 1)]
    lines = dict(_line_index(root)) if root is not None else {}
    problems = []
    found = (_specific(e) for e in validator.iter_errors(doc))
    for error in sorted(found, key=lambda e: [str(p) for p in e.absolute_path]):
        path = _problem_path(error)
        line = lines.get(path) or lines.get(tuple(error.absolute_path))
        problems.append(SpecProblem(file, format_json_path(path), _describe(error), line))
    problems += _duplicate_keys(root, file) if root is not None else []
    return doc, lines, problems


def check_spec_text(text: str, file: str = "<spec>") -> tuple[FleetSpec | None, list[SpecProblem]]:
    """Validate spec text. Returns (spec or None, every problem found: errors and warnings)."""
    doc, lines, problems = checked_yaml(text, file, _spec_validator(), "version/image/controller/pools")
    if doc is None:
        return None, problems
    problems += _semantic_problems(doc, file, lines)
    if any(p.severity == "error" for p in problems):
        return None, problems
    return _build(doc, file, problems), problems


def load_spec(path: str | Path) -> FleetSpec:
    """Load and validate a spec file; raise SpecError with every problem if it is not usable."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([SpecProblem(str(path), "$", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([SpecProblem(str(path), "$", f"cannot read: {exc}")]) from None
    spec, problems = check_spec_text(text, str(path))
    if spec is None:
        raise SpecError(problems)
    return with_hosts(with_capacity(spec, path), path)


def with_capacity(spec: FleetSpec, spec_path: Path) -> FleetSpec:
    """The spec with the leader's capacity.yaml (beside it) applied to its autoscaled pools."""
    if not any(p.min_count is not None for p in spec.pools):
        return spec
    entries, problems = load_capacity(spec_path)
    if problems:
        raise SpecError(problems)
    return apply_entries(spec, entries)


# --- the owned-hosts inventory (fleet-spec/hosts.yaml): optional, checked with the spec it sits beside -------------

def hosts_path(spec_path: Path) -> Path:
    """The inventory beside a spec file (fleet-spec/hosts.yaml beside fleet-spec/fleet.yaml)."""
    return Path(spec_path).parent / HOSTS_FILE


@cache
def _hosts_validator() -> jsonschema.Draft202012Validator:
    return strict_validator(json.loads(HOSTS_SCHEMA_PATH.read_text()))


def check_hosts_text(text: str, file: str = "<hosts>") -> tuple[tuple[OwnedHost, ...] | None, list[SpecProblem]]:
    """Validate inventory text: (hosts or None, every problem)."""
    doc, lines, problems = checked_yaml(text, file, _hosts_validator(), "version/hosts")
    if doc is None or problems:
        return None, problems
    names: dict[str, int] = {}
    endpoints: dict[str, int] = {}
    for i, host in enumerate(doc["hosts"]):
        def add(key: str, message: str, i: int = i) -> None:
            path = ("hosts", i, key)
            problems.append(SpecProblem(file, format_json_path(path), message, lines.get(path)))

        if host["name"] in names:
            add("name", f"duplicate host name {host['name']!r} (first at $.hosts[{names[host['name']]}])")
        names.setdefault(host["name"], i)
        if host["docker"] in endpoints:
            add("docker", f"{host['docker']} is also $.hosts[{endpoints[host['docker']]}]: one Docker engine is one "
                "host (its GPUs would be offered twice)")
        endpoints.setdefault(host["docker"], i)
        if host["docker"].startswith("tcp://") and "tls" not in host:
            add("docker", f"got {host['docker']}: a tcp:// endpoint needs tls (ca, cert, key); Docker's API without "
                "TLS gives root on the host to anyone who can reach the port")
        if host["docker"].startswith("ssh://") and "tls" in host:
            add("tls", "has no effect on an ssh:// endpoint (SSH authenticates and encrypts it)")
    if problems:
        return None, problems
    return tuple(_host(h) for h in doc["hosts"]), problems


def _host(h: dict[str, Any]) -> OwnedHost:
    gpus = h["gpus"]
    uuids = tuple(gpus) if isinstance(gpus, list) else ()
    tls = DockerTls(**h["tls"]) if isinstance(h.get("tls"), dict) else None
    return OwnedHost(name=h["name"], docker=h["docker"], gpu_name=h["gpu_name"], gpu_uuids=uuids,
                     gpu_count=len(uuids) if uuids else int(gpus), ram_gb=float(h["ram_gb"]),
                     disk_gb=float(h["disk_gb"]), cost_usd_per_gpu_hour=float(h["cost_usd_per_gpu_hour"]),
                     labels=dict(h.get("labels", {})), state=h.get("state", "active"),
                     network=h.get("network", "bridge"), gpu_access=h.get("gpu_access", "runtime"), tls=tls)


def cross_problems(spec: FleetSpec, hosts: tuple[OwnedHost, ...], spec_file: str,
                   hosts_file: str) -> list[SpecProblem]:
    """The two files together: every pool on owned hosts must have a host that can serve it."""
    problems = []
    for i, pool in enumerate(spec.pools):
        if pool.hosts is None:
            continue
        where = f"$.pools[{i}].hosts"
        if pool.gpus_per_instance != 1:
            problems.append(SpecProblem(spec_file, f"$.pools[{i}].gpus_per_instance", f"got "
                                        f"{pool.gpus_per_instance}: a pool on owned hosts runs one GPU per slot"))
        serving = [h for h in hosts if h.serves(pool.gpu_name, pool.hosts)]
        active = [h for h in serving if h.state == "active"]
        if not hosts:
            problems.append(SpecProblem(spec_file, where, f"pool {pool.name} runs on owned hosts, but there is no "
                                        f"{hosts_file}"))
        elif not serving:
            problems.append(SpecProblem(spec_file, where, f"no host in {hosts_file} can serve pool {pool.name}: none "
                                        f"has GPU {pool.gpu_name!r} and labels {pool.hosts.describe()}"))
        elif not active:
            problems.append(SpecProblem(spec_file, where, f"every host that can serve pool {pool.name} is drained or "
                                        f"banned ({', '.join(h.name for h in serving)})", severity="warning"))
        else:
            gpus = sum(h.gpu_count for h in active)
            _, high = pool.bounds
            if gpus < high:
                problems.append(SpecProblem(spec_file, f"$.pools[{i}].count", f"pool {pool.name} wants up to {high} "
                                            f"slot(s) but its active hosts ({', '.join(h.name for h in active)}) "
                                            f"have {gpus} GPU(s): {high - gpus} slot(s) will stay empty",
                                            severity="warning"))
    return problems


def load_hosts(path: Path) -> tuple[OwnedHost, ...] | None:
    """The inventory at `path`, None when there is no such file; SpecError with every problem when it is bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([SpecProblem(str(path), "$", f"cannot read: {exc}")]) from None
    hosts, problems = check_hosts_text(text, str(path))
    if hosts is None:
        raise SpecError(problems)
    return hosts


def with_hosts(spec: FleetSpec, spec_path: Path) -> FleetSpec:
    """The spec with the inventory beside it; SpecError when either file (or the two together) is wrong."""
    path = hosts_path(spec_path)
    hosts = load_hosts(path) or ()
    problems = [p for p in cross_problems(spec, hosts, str(spec_path), str(path)) if p.severity == "error"]
    if problems:
        raise SpecError(problems)
    return replace(spec, hosts=hosts) if hosts else spec


# --- the validated-spec cache ------------------------------------------------------------------------------------

#: Bump when what the cache file holds changes.
_SPEC_CACHE_FORMAT = 1


def _validation_inputs() -> bytes:
    """Everything besides the spec's bytes that validation's outcome depends on: the schema, the code of this
    module and of the domain (semantic checks, the FleetSpec classes), the Python version, and which PyYAML
    and jsonschema are installed (their files' size and mtime; found without importing them)."""
    import importlib.util

    import reconciler.domain

    h = hashlib.sha256(f"{_SPEC_CACHE_FORMAT}\0{sys.version}\0".encode())
    h.update(SPEC_SCHEMA_PATH.read_bytes())
    h.update(HOSTS_SCHEMA_PATH.read_bytes())
    h.update(Path(__file__).read_bytes())
    for source in sorted(Path(reconciler.domain.__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    for library in ("yaml", "jsonschema"):
        found = importlib.util.find_spec(library)
        origin = found.origin if found is not None else None
        if origin:
            st = os.stat(origin)
            h.update(f"{origin}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.digest()


def spec_cache_path(spec_path: Path) -> Path:
    """Where load_spec_cached keeps the last valid spec of the directory holding `spec_path`."""
    return cache_file(spec_path.parent, "spec", ".pickle")


def load_spec_cached(path: str | Path, cache: Path | None = None) -> FleetSpec:
    """`load_spec`, remembering a spec that passed by the hash of its bytes, of the name it was loaded under
    and of everything validation depends on (`_validation_inputs`): a read-only command whose spec has not
    changed neither parses nor validates it again, and imports neither PyYAML nor jsonschema. A spec with
    problems is never remembered (its errors are reported in full each time). The cache (`cache`, default
    `spec_cache_path`) is rebuildable: a missing, unreadable or foreign file only means validating again."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError:
        return load_spec(path)  # its error names the file and the problem
    with contextlib.suppress(OSError):  # the leader's capacity.yaml decides autoscaled pools' slots: cached too
        raw += b"\0capacity\0" + capacity_path(path).read_bytes()
    with contextlib.suppress(OSError):  # so does the owned-hosts inventory beside it
        raw += b"\0hosts\0" + hosts_path(path).read_bytes()
    key = hashlib.sha256(raw + b"\0" + str(path).encode() + b"\0" + _validation_inputs()).hexdigest()
    cache = cache if cache is not None else spec_cache_path(path)
    try:
        stored = pickle.loads(cache.read_bytes())  # noqa: S301 - our own cache file, in the git dir
    except Exception:  # missing, unreadable, truncated or foreign: validate again and rewrite it
        stored = None
    if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("spec"), FleetSpec):
        return cast(FleetSpec, stored["spec"])
    spec = load_spec(path)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(pickle.dumps({"key": key, "spec": spec}, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, cache)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:  # a read-only git dir: validate every time
        tmp.unlink(missing_ok=True)
    return spec
