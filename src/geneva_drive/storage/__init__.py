"""The schema and every statement: models, serialization, heroes, input limits, engine
preparation, migrations and the named queries. It knows rows, never the ``Workflow`` class."""
