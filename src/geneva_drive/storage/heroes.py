"""What ``hero_type`` stores for a mapped class, and the class a stored one names.

A hero's type is stored as its class's bare name (``Order``) unless the class declares
``__hero_type__ = "billing.Order"``; the gem stores the class name too. A bare name need not be
unique in a process — two modules, or two declarative bases, may each map an ``Order`` — and a
name two classes share cannot say which table a stored hero lives in. So a shared name is an
error (:class:`AmbiguousHeroType`, naming the classes and the fix) wherever it is met: storing
a hero, looking one up by hero, loading one. Never a pick.

Its own module, importing nothing of geneva-drive above ``core``: both ``workflow`` (the
``hero`` property) and ``serialization`` (stored references) need it, and ``workflow`` imports
``serialization``.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import event
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Mapper, mapperlib

from geneva_drive.core.errors import AmbiguousHeroType, StepConfigurationError

ATTRIBUTE = "__hero_type__"


def hero_type_of(cls: type[Any]) -> str:
    """What ``hero_type`` stores for an instance of ``cls`` (a mapped class).

    ``__hero_type__`` counts only where it is set, as ``workflow_type`` does: a subclass is a
    class of its own and stores its own name.
    """
    declared = cls.__dict__.get(ATTRIBUTE)
    if declared is None:
        return cls.__name__
    where = f"{_label(cls)}.{ATTRIBUTE} = {declared!r}"
    if not isinstance(declared, str) or not declared:
        raise StepConfigurationError(
            f"{where}: expected a non-empty str, the name hero_type stores for this class "
            f"(e.g. {_suggestion(cls)!r})"
        )
    if ":" in declared:
        # Filters write a hero as ``type:id`` (``hero=Order:42``) and split at the first colon.
        raise StepConfigurationError(
            f"{where}: a hero type may not contain ':', which separates it from the id in "
            f"hero filters; use dots, e.g. {_suggestion(cls)!r}"
        )
    return declared


def checked_hero_type(cls: type[Any]) -> str:
    """``hero_type_of(cls)``, after making sure no other mapped class stores the same name."""
    name = hero_type_of(cls)
    others = [c for c in _classes(name) if c is not cls]
    if others:
        raise AmbiguousHeroType(_ambiguity(name, others, cls))
    return name


def resolve_hero_class(name: str) -> type[Any]:
    """The one mapped class of this process whose ``hero_type`` is ``name``.

    Raises ``AmbiguousHeroType`` when several are, and ``LookupError`` when none is.
    """
    classes = _classes(name)
    if len(classes) > 1:
        raise AmbiguousHeroType(_ambiguity(name, classes[:-1], classes[-1]))
    if not classes:
        raise LookupError(
            f"hero_type {name!r} names no mapped class in this process; import the module that "
            "defines it before running workflows"
        )
    return classes[0]


def loaded_hero_types() -> list[str]:
    """The ``hero_type`` of every mapped class in this process, sorted."""
    index = _index()
    if not all(_mapped(c) for classes in index.values() for c in classes):
        index = _index(rescan=True)
    return sorted(index)


# -- the index --------------------------------------------------------------------------------
#
# Scanning every mapper of every registry for each hero would cost a step a loop over the
# application's models, so the scan is kept — and thrown away when it could be wrong: whenever
# a mapper is built after it (a module imported late), and whenever a class in it has been
# disposed of. A kept scan therefore never pins a class a later one shares a name with.

_lock = threading.Lock()
_generation = 0  # mappers built since the process started (once the listener is in place)
_kept: tuple[int, dict[str, list[type[Any]]]] | None = None


def _classes(name: str) -> list[type[Any]]:
    """The mapped classes whose ``hero_type`` is ``name``, sorted by module and name."""
    classes = _index().get(name, [])
    if not all(_mapped(c) for c in classes):
        classes = _index(rescan=True).get(name, [])
    return classes


def _index(*, rescan: bool = False) -> dict[str, list[type[Any]]]:
    """Every mapped class of the process by the ``hero_type`` it stores."""
    global _kept
    kept = _kept
    if kept is not None and kept[0] == _generation and not rescan:
        return kept[1]
    _listen()
    generation = _generation  # read before the scan: a mapper built during it discards it
    index: dict[str, list[type[Any]]] = {}
    # SQLAlchemy keeps no public list of registries; this private set is stable since 1.4.
    for registry in list(mapperlib._all_registries()):
        for mapper in list(registry.mappers):
            cls = mapper.class_
            name = cls.__dict__.get(ATTRIBUTE)
            # A declared name that is not usable is refused where it is stored (create());
            # here it only keeps the class out of every other name's way.
            index.setdefault(name if isinstance(name, str) else cls.__name__, []).append(cls)
    for classes in index.values():
        classes.sort(key=_label)
    _kept = (generation, index)
    return index


def _mapped(cls: type[Any]) -> bool:
    """False for a class whose registry has been disposed of since the scan."""
    return sa_inspect(cls, raiseerr=False) is not None


def _listen() -> None:
    """Count mappers built from now on (done at the first lookup, not at import)."""
    with _lock:
        if not event.contains(Mapper, "after_mapper_constructed", _mapper_built):
            event.listen(Mapper, "after_mapper_constructed", _mapper_built)


def _mapper_built(mapper: Mapper[Any], cls: type[Any]) -> None:
    global _generation
    with _lock:
        _generation += 1


# -- messages ---------------------------------------------------------------------------------


def _label(cls: type[Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _suggestion(cls: type[Any]) -> str:
    """``billing.Order`` for ``myapp.billing.Order``: the class name, told apart by module."""
    return f"{cls.__module__.rpartition('.')[2]}.{cls.__name__}"


def _ambiguity(name: str, others: list[type[Any]], cls: type[Any]) -> str:
    """The error for ``name`` shared by ``others`` and ``cls`` (the one the fix is shown on)."""

    def described(c: type[Any]) -> str:
        table = getattr(sa_inspect(c).local_table, "name", None)
        return _label(c) + (f" (table {table})" if table else "")

    listed = ", ".join(described(c) for c in others) + " and " + described(cls)
    return (
        f"hero_type {name!r} names {len(others) + 1} mapped classes, {listed}, so a stored "
        f"hero could be read from the wrong table; set {ATTRIBUTE} = '<a unique name>' on all "
        f"but one of them, e.g. {ATTRIBUTE} = {_suggestion(cls)!r} on {_label(cls)} "
        f"(hero_type stores it; rows stored as {name!r} then load the class that keeps it)"
    )
