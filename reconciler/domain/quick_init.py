"""`quick_init`: a frozen dataclass built at the cost of a plain one. A base of the domain: no I/O, imports nothing of
the package.

Why: a frozen dataclass's generated `__init__` sets each field through `object.__setattr__` (its own `__setattr__`
refuses), a call per field. `quick_init` gives the class an `__init__` with the same parameters, defaults, default
factories, `init=False` fields and `__post_init__` call that stores the fields straight into the instance's
`__dict__`: the instance is equal, and still frozen (assigning a field still raises `FrozenInstanceError`).

Where: the value types made by the hundred thousand. `demand.PoolSample` (36 fields), read from the demand files
before `fleet plan --what-if` can fork its replays: 5.7 -> 3.1 us a sample. The types each replay makes (slot
signals, capacity entries and decisions, reports, verdicts, records; ~10 million fields a replay at 10,000
machines): the what-if 0.97x side by side. The price: CPython keeps a small instance's fields without a dict until
its `__dict__` is asked for, so these instances carry a dict (+64 bytes each; +3.5% peak for that what-if).

Only for frozen dataclasses without `__slots__` and without `InitVar` fields: anything else is refused at import.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

#: The default factories' marker in a generated signature (as dataclasses' own `_HAS_DEFAULT_FACTORY`).
_FACTORY = object()
_RESERVED = frozenset({"self", "_d", "_FACTORY"})


def quick_init(cls: type[T]) -> type[T]:
    """`cls` (a frozen dataclass) with the quick `__init__`; the dataclass's own stays as `__dataclass_init__`
    (the tests build with both and compare)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"quick_init: {cls.__qualname__} is not a frozen dataclass")
    if "__slots__" in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__qualname__} has __slots__ (no instance dict to store into)")
    declared = cls.__dict__["__dataclass_fields__"].values()
    if any(f._field_type is not dataclasses._FIELD for f in declared  # type: ignore[attr-defined]
           if f._field_type is not dataclasses._FIELD_CLASSVAR):  # type: ignore[attr-defined]
        raise TypeError(f"quick_init: {cls.__qualname__} has an InitVar field")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    clash = _RESERVED.intersection(f.name for f in fields)
    if clash:
        raise TypeError(f"quick_init: {cls.__qualname__} has a field named {sorted(clash)[0]!r}")

    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body = ["    _d = self.__dict__"]
    for f in fields:
        has_default = f.default is not dataclasses.MISSING
        has_factory = f.default_factory is not dataclasses.MISSING
        if has_default:
            namespace[f"_default_{f.name}"] = f.default
        if has_factory:
            namespace[f"_factory_{f.name}"] = f.default_factory
        if not f.init:  # not a parameter: its factory's value; a plain default is the class attribute's (as
            # dataclasses does: the instance does not hold it)
            if has_factory:
                body.append(f"    _d[{f.name!r}] = _factory_{f.name}()")
            continue
        param = f"{f.name}=_default_{f.name}" if has_default else f"{f.name}=_FACTORY" if has_factory else f.name
        (keyword if f.kw_only else positional).append(param)
        if has_factory:
            body.append(f"    _d[{f.name!r}] = _factory_{f.name}() if {f.name} is _FACTORY else {f.name}")
        else:
            body.append(f"    _d[{f.name!r}] = {f.name}")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    exec(f"def __init__({signature}):\n" + "\n".join(body) + "\n", namespace)  # noqa: S102 - our own text
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__dataclass_init__ = cls.__init__  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
