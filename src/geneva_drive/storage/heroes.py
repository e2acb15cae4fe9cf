"""Finding a hero's mapped class by the name stored in ``hero_type``.

A module of its own, importing nothing of geneva-drive: both ``workflow`` (the ``hero``
property) and ``serialization`` (stored references) need it, and ``workflow`` imports
``serialization``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import mapperlib

_hero_classes: dict[str, type[Any]] = {}


def resolve_hero_class(name: str) -> type[Any]:
    """The mapped class called ``name`` in any SQLAlchemy registry of this process."""
    found = _hero_classes.get(name)
    if found is not None:
        return found
    # SQLAlchemy keeps no public list of registries; this private set is stable since 1.4.
    for registry in list(mapperlib._all_registries()):
        for mapper in registry.mappers:
            if mapper.class_.__name__ == name:
                _hero_classes[name] = mapper.class_
                return mapper.class_
    raise LookupError(
        f"hero_type {name!r} names no mapped class in this process; import the module that "
        "defines it before running workflows"
    )
