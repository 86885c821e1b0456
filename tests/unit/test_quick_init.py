"""`quick_init` builds the same frozen instances as the dataclass's own `__init__`, and refuses what it cannot."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import FrozenInstanceError, InitVar, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

import reconciler.domain
from reconciler.domain.capacity import Utilization
from reconciler.domain.demand import PoolSample
from reconciler.domain.quick_init import quick_init

POST_INIT_CALLS: list[Any] = []


@quick_init
@dataclass(frozen=True)
class _Shape:
    name: str
    count: int
    note: str = "none"
    tags: list[str] = field(default_factory=list)
    fixed: int = field(default=7, init=False)
    cache: dict[str, int] = field(default_factory=dict, init=False, compare=False)
    unset: int = field(init=False, compare=False, default=0)
    flag: bool = field(default=False, kw_only=True)
    label: str = field(kw_only=True, default="x")

    def __post_init__(self) -> None:
        POST_INIT_CALLS.append(self.name)
        object.__setattr__(self, "unset", self.count * 2)


def _both(cls: type, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    quick = cls(*args, **kwargs)
    slow = object.__new__(cls)
    cls.__dataclass_init__(slow, *args, **kwargs)
    return quick, slow


@pytest.mark.parametrize(("args", "kwargs"), [
    (("a", 1), {}),
    (("a", 1, "n"), {}),
    (("a", 1, "n", ["t"]), {"flag": True, "label": "y"}),
    ((), {"name": "a", "count": 2, "tags": ["u"], "label": "z"}),
])
def test_the_same_instance_as_the_dataclass_init(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    POST_INIT_CALLS.clear()
    quick, slow = _both(_Shape, *args, **kwargs)
    assert vars(quick) == vars(slow) and quick == slow
    assert list(vars(quick)) == list(vars(slow))  # the same fields, set in the same order
    assert [quick.name, slow.name] == POST_INIT_CALLS  # __post_init__ ran once for each
    assert quick.unset == 2 * quick.count


def test_default_factories_make_a_new_value_for_each_instance() -> None:
    one, two = _Shape("a", 1), _Shape("b", 2)
    assert one.tags == [] and one.tags is not two.tags and one.cache is not two.cache


def test_still_frozen_and_the_same_argument_errors() -> None:
    shape = _Shape("a", 1)
    with pytest.raises(FrozenInstanceError):
        shape.count = 2  # type: ignore[misc]
    for args, kwargs in [((), {}), (("a",), {}), (("a", 1, "n", [], 3), {}), (("a", 1), {"fixed": 3}),
                         (("a", 1), {"nope": 1}), (("a", 1, "n", [], True), {})]:
        with pytest.raises(TypeError):
            _Shape(*args, **kwargs)
        with pytest.raises(TypeError):
            _Shape.__dataclass_init__(object.__new__(_Shape), *args, **kwargs)  # type: ignore[attr-defined]


def test_a_demand_sample_is_the_same_either_way() -> None:
    every = {f.name: f"v-{f.name}" for f in dataclasses.fields(PoolSample)}
    quick, slow = _both(PoolSample, **every)
    assert vars(quick) == vars(slow)
    at = datetime(2026, 12, 1, 10, 5, tzinfo=UTC)
    fewest = dict(pool="p", at=at, span_s=60.0, desired=2, slots=2, draining=0, serving=2, on_the_way=0, stopped=0,
                  draining_serving=0, busy_s=100.0, wall_s=120.0, proofs=3, usd_per_hour=1.2, unpriced=0)
    quick, slow = _both(PoolSample, **fewest, up=Utilization(1.0, 2.0, 2, 600.0))
    assert vars(quick) == vars(slow) and quick == slow and quick.extra == {} and quick.rented == 2


def _quick_classes() -> list[type]:
    found = []
    for module in pkgutil.iter_modules(reconciler.domain.__path__):
        for value in vars(importlib.import_module(f"reconciler.domain.{module.name}")).values():
            if isinstance(value, type) and "__dataclass_init__" in value.__dict__ and value not in found:
                found.append(value)
    return found


def test_every_quick_class_of_the_domain_builds_what_its_dataclass_init_builds() -> None:
    classes = _quick_classes()
    assert {c.__name__ for c in classes} >= {"PoolSample", "PoolSignals", "CapacityEntry", "Verdict", "FleetSpec"}
    for cls in classes:
        params = [f for f in dataclasses.fields(cls) if f.init]
        required = {f.name: object() for f in params if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        every = {f.name: object() for f in params}
        for kwargs in (required, every):
            quick, slow = _both(cls, **kwargs)
            assert vars(quick) == vars(slow), cls.__qualname__
            assert list(vars(quick)) == list(vars(slow)), cls.__qualname__
        positional = [f.name for f in params if not f.kw_only]
        quick, slow = _both(cls, *(every[n] for n in positional), **{f.name: every[f.name] for f in params
                                                                    if f.kw_only})
        assert vars(quick) == vars(slow), cls.__qualname__


def test_what_it_cannot_build_is_refused_at_import() -> None:
    with pytest.raises(TypeError, match="not a frozen dataclass"):
        quick_init(dataclass(type("Plain", (), {"__annotations__": {"a": int}})))
    with pytest.raises(TypeError, match="__slots__"):
        quick_init(dataclass(frozen=True, slots=True)(type("Slotted", (), {"__annotations__": {"a": int}})))
    with pytest.raises(TypeError, match="InitVar"):
        quick_init(dataclass(frozen=True)(type("WithInitVar", (), {"__annotations__": {"a": InitVar[int]}})))
    with pytest.raises(TypeError, match="'self'"):
        quick_init(dataclass(frozen=True)(type("Clash", (), {"__annotations__": {"self": int}})))
