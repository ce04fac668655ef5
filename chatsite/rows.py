"""Rows read and written with SQL written once, instead of a query compiled per call.

Django compiles a queryset's SQL every time it runs; for the few statements on every request's
way (a send reads its conversation, inserts its messages and its generation) that compilation
cost more than the round trip. Names come from the models and the caller's code, never from
input; every value is a bound parameter.

- `one` reads a row as the instance the ORM would build, its fields' converters applied;
- `insert_sql` is the INSERT of new instances, one row of values each, prepared as the ORM
  prepares them; `insert` runs it for one. Neither sends the model's signals (as
  `bulk_create`), and the primary key must be set (a UUID's default is).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection, models

M = TypeVar("M", bound=models.Model)


@cache
def _select(model: type[models.Model], where: str) -> tuple[str, tuple[str, ...]]:
    quote = connection.ops.quote_name
    fields = model._meta.concrete_fields
    columns = ", ".join(quote(str(field.column)) for field in fields)
    sql = f"SELECT {columns} FROM {quote(model._meta.db_table)} WHERE {where} LIMIT 1"  # noqa: S608
    return sql, tuple(field.attname for field in fields)


@cache
def _converters(model: type[models.Model]) -> tuple[tuple[int, Any, Any], ...]:
    """(position, converter, column) of each field that turns what the database gives into
    its value (a JSON field's text, say), as the ORM's compiler applies them."""
    found = []
    for position, field in enumerate(model._meta.concrete_fields):
        column = field.get_col(model._meta.db_table)
        for converter in [
            *connection.ops.get_db_converters(column),
            *field.get_db_converters(connection),
        ]:
            found.append((position, converter, column))
    return tuple(found)


def one(model: type[M], where: str, params: Sequence[Any]) -> M | None:
    """The first row of `model`'s table where `where` holds (SQL from the caller's code with
    `%s` for each of `params`), as an instance; None if there is none."""
    sql, names = _select(model, where)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)
    for position, converter, column in _converters(model):
        values[position] = converter(values[position], column, connection)
    return model.from_db(connection.alias, list(names), values)


@cache
def _insert_fields(model: type[models.Model]) -> tuple[Any, ...]:
    return tuple(field for field in model._meta.concrete_fields if not field.generated)


def insert_sql(model: type[M], instances: Sequence[M]) -> tuple[str, list[Any]]:
    """The INSERT of `instances` (new, of `model`) with its parameters: one row of values
    each, prepared as the ORM prepares them (`pre_save` fills creation times)."""
    fields = _insert_fields(model)
    quote = connection.ops.quote_name
    row = f"({', '.join(['%s'] * len(fields))})"
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)}"  # noqa: S608
        f" ({', '.join(quote(str(field.column)) for field in fields)})"
        f" VALUES {', '.join([row] * len(instances))}"
    )
    params = [
        field.get_db_prep_save(field.pre_save(instance, True), connection)
        for instance in instances
        for field in fields
    ]
    return sql, params


def saved(instances: Sequence[models.Model]) -> None:
    """Mark `instances` as rows of the database, as a save does."""
    for instance in instances:
        instance._state.adding = False
        instance._state.db = connection.alias


def insert(instance: M) -> M:
    """Insert `instance` (new, its primary key set) as one row; returns it, saved."""
    if instance.pk is None:
        raise ValueError("rows.insert needs the primary key set")
    sql, params = insert_sql(type(instance), [instance])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    saved([instance])
    return instance
