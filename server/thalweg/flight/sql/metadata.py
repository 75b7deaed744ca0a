"""Answers to the catalog commands: SQL info, catalogs, schemas, tables, table types, keys.

Every result is a small Arrow table with the exact schema the Flight SQL specification
gives for its command (clients — JDBC above all — read them by position and type, so a
nullable flag or a union layout that differs breaks them). The gateway has one catalog,
``thalweg``, with the schemas ``decoded``, ``raw`` and ``dlq`` (docs/flight-sql.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import pyarrow as pa

CATALOG = "thalweg"
DEFAULT_SCHEMA = "decoded"  # where an unqualified table name is looked up
TABLE_TYPE = "TABLE"

# -- CommandGetSqlInfo ----------------------------------------------------------------------

# The value column's dense union, in the specification's order and type codes 0-5.
SQL_INFO_VALUE = pa.dense_union(
    [
        pa.field("string_value", pa.string()),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.string())),
        pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
    ],
    type_codes=[0, 1, 2, 3, 4, 5],
)
SQL_INFO_SCHEMA = pa.schema(
    [pa.field("info_name", pa.uint32(), nullable=False), pa.field("value", SQL_INFO_VALUE, False)]
)

# SqlInfo ids (the specification's enum) the gateway answers.
SERVER_NAME, SERVER_VERSION, SERVER_ARROW_VERSION, SERVER_READ_ONLY = 0, 1, 2, 3
SERVER_SQL, SERVER_SUBSTRAIT, SERVER_TRANSACTION, SERVER_CANCEL = 4, 5, 8, 9
STATEMENT_TIMEOUT, TRANSACTION_TIMEOUT = 100, 101
DDL_CATALOG, DDL_SCHEMA, DDL_TABLE = 500, 501, 502
IDENTIFIER_CASE, IDENTIFIER_QUOTE_CHAR, ALL_TABLES_ARE_SELECTABLE = 503, 504, 506
CASE_LOWERCASE = 3  # SqlSupportedCaseSensitivity: unquoted names fold to lower case
TRANSACTION_NONE = 0  # SqlSupportedTransaction


def _gateway_version() -> str:
    try:
        return version("thalweg")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "0+unknown"


def sql_info_values() -> dict[int, str | bool | int]:
    """What the gateway says about itself (strings, booleans, int32 values)."""
    return {
        SERVER_NAME: "Thalweg",
        SERVER_VERSION: _gateway_version(),
        SERVER_ARROW_VERSION: pa.__version__,
        SERVER_READ_ONLY: False,  # CommandStatementIngest appends to topics
        SERVER_SQL: True,
        SERVER_SUBSTRAIT: False,
        SERVER_TRANSACTION: TRANSACTION_NONE,
        SERVER_CANCEL: False,
        STATEMENT_TIMEOUT: 0,  # prepared-statement handles carry their state: no expiry
        TRANSACTION_TIMEOUT: 0,
        DDL_CATALOG: False,
        DDL_SCHEMA: False,
        DDL_TABLE: False,
        IDENTIFIER_CASE: CASE_LOWERCASE,
        IDENTIFIER_QUOTE_CHAR: '"',
        ALL_TABLES_ARE_SELECTABLE: True,
    }


_INT32_INFOS = {SERVER_TRANSACTION, STATEMENT_TIMEOUT, TRANSACTION_TIMEOUT, IDENTIFIER_CASE}


def sql_info(requested: Sequence[int]) -> pa.Table:
    """The rows of ``CommandGetSqlInfo``: the ids asked for that the gateway knows (all
    of them when none are asked for), in the order asked."""
    values = sql_info_values()
    ids = [i for i in requested if i in values] if requested else sorted(values)
    type_ids, offsets = [], []
    children: list[list[object]] = [[], [], [], [], [], []]
    for info in ids:
        value = values[info]
        code = (
            1
            if isinstance(value, bool)
            else 3
            if info in _INT32_INFOS
            else 2
            if isinstance(value, int)
            else 0
        )
        type_ids.append(code)
        offsets.append(len(children[code]))
        children[code].append(value)
    arrays = [
        pa.array(children[i], type=SQL_INFO_VALUE.field(i).type) for i in range(len(children))
    ]
    union = pa.UnionArray.from_dense(
        pa.array(type_ids, pa.int8()),
        pa.array(offsets, pa.int32()),
        arrays,
        [SQL_INFO_VALUE.field(i).name for i in range(len(children))],
        list(SQL_INFO_VALUE.type_codes),
    )
    return pa.Table.from_arrays([pa.array(ids, pa.uint32()), union], schema=SQL_INFO_SCHEMA)


# -- catalogs, schemas, tables --------------------------------------------------------------

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.string(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema(
    [pa.field("catalog_name", pa.string()), pa.field("db_schema_name", pa.string(), False)]
)
TABLES_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.string()),
        pa.field("db_schema_name", pa.string()),
        pa.field("table_name", pa.string(), nullable=False),
        pa.field("table_type", pa.string(), nullable=False),
    ]
)
TABLES_WITH_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), nullable=False))
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.string(), nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.string()),
        pa.field("db_schema_name", pa.string()),
        pa.field("table_name", pa.string(), False),
        pa.field("column_name", pa.string(), False),
        pa.field("key_name", pa.string()),
        pa.field("key_sequence", pa.int32(), False),
    ]
)
FOREIGN_KEYS_SCHEMA = pa.schema(
    [
        pa.field("pk_catalog_name", pa.string()),
        pa.field("pk_db_schema_name", pa.string()),
        pa.field("pk_table_name", pa.string(), False),
        pa.field("pk_column_name", pa.string(), False),
        pa.field("fk_catalog_name", pa.string()),
        pa.field("fk_db_schema_name", pa.string()),
        pa.field("fk_table_name", pa.string(), False),
        pa.field("fk_column_name", pa.string(), False),
        pa.field("key_sequence", pa.int32(), False),
        pa.field("fk_key_name", pa.string()),
        pa.field("pk_key_name", pa.string()),
        pa.field("update_rule", pa.uint8(), False),
        pa.field("delete_rule", pa.uint8(), False),
    ]
)


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One table: ``db_schema`` is the lane (or ``nodes``), ``name`` the topic (or the
    node), ``topic`` the topic whose read permission it needs."""

    db_schema: str
    name: str
    schema: pa.Schema
    topic: str = ""

    @property
    def source(self) -> str:
        return self.topic or self.name


def like(pattern: str | None) -> re.Pattern[str] | None:
    """A Flight SQL filter pattern (SQL LIKE: ``%`` any run, ``_`` one character) as a
    regular expression; None matches everything."""
    if pattern is None:
        return None
    parts = ("." if c == "_" else ".*" if c == "%" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL)


def _matches(rx: re.Pattern[str] | None, name: str) -> bool:
    return rx is None or rx.fullmatch(name) is not None


def _catalog_ok(catalog: str | None) -> bool:
    return catalog is None or catalog == CATALOG


def catalogs() -> pa.Table:
    return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=CATALOGS_SCHEMA)


def db_schemas(names: Iterable[str], catalog: str | None, pattern: str | None) -> pa.Table:
    rx = like(pattern)
    rows = (
        [{"catalog_name": CATALOG, "db_schema_name": n} for n in sorted(names) if _matches(rx, n)]
        if _catalog_ok(catalog)
        else []
    )
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def tables(
    entries: Iterable[TableEntry],
    *,
    catalog: str | None,
    schema_pattern: str | None,
    table_pattern: str | None,
    table_types: Sequence[str],
    include_schema: bool,
) -> pa.Table:
    """The rows of ``CommandGetTables``, ordered as the specification asks."""
    out = TABLES_WITH_SCHEMA if include_schema else TABLES_SCHEMA
    if not _catalog_ok(catalog) or (table_types and TABLE_TYPE not in table_types):
        return out.empty_table()
    srx, trx = like(schema_pattern), like(table_pattern)
    rows = []
    for e in sorted(entries, key=lambda e: (e.db_schema, e.name)):
        if _matches(srx, e.db_schema) and _matches(trx, e.name):
            row: dict[str, object] = {
                "catalog_name": CATALOG,
                "db_schema_name": e.db_schema,
                "table_name": e.name,
                "table_type": TABLE_TYPE,
            }
            if include_schema:
                row["table_schema"] = e.schema.serialize().to_pybytes()
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=out)


def table_types() -> pa.Table:
    return pa.Table.from_pylist([{"table_type": TABLE_TYPE}], schema=TABLE_TYPES_SCHEMA)
