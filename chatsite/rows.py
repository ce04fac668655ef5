"""One row as a model instance, read with SQL written once instead of a query compiled per call.

Django compiles a queryset's SQL every time it runs; for the few reads on every request's way
(a send reads its conversation first) that compilation cost more than the round trip. `one`
reads a row of a model's table with a fixed statement (its columns from the model, the
condition from the caller's code, never from input; every value a bound parameter) and builds
the instance as the ORM would, its fields' converters applied.
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
def _converters(model: type[models.Model]) -> tuple[tuple[int, Any], ...]:
    """(position, converter) of each field that turns what the database gives into its value
    (a JSON field's text, say), as the ORM's compiler applies them."""
    found = []
    for position, field in enumerate(model._meta.concrete_fields):
        for converter in [
            *connection.ops.get_db_converters(field.get_col(model._meta.db_table)),
            *field.get_db_converters(connection),
        ]:
            found.append((position, converter))
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
    for position, converter in _converters(model):
        values[position] = converter(
            values[position], model._meta.concrete_fields[position].get_col(""), connection
        )
    return model.from_db(connection.alias, list(names), values)
