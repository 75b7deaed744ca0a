"""PostgreSQL tables through ADBC: one table per topic, each flush one transaction.

A flush bulk-loads every topic's rows with ADBC ingest (binary ``COPY``) into a
temporary staging table, moves them with ``INSERT … ON CONFLICT (_twg_record_id) DO
NOTHING``, and writes the covered positions into ``_thalweg_coverage`` — all in one
transaction. So a record is in the table once however often it is replayed, and the
coverage table (trusted over the coverage store on open) never claims a row the
transaction did not commit: exactly-once (ADR 0023).

With ``mode = "upsert"`` the table holds one row per ``key`` instead (docs/cdc.md): the
staged rows are folded to each key's newest (by lane position), deletes (``__deleted``)
remove the key's row, the rest insert or update it — never over a row of a newer
position — and the coverage rows go in the same transaction.

Types: the staging table is created by ADBC from the Arrow schema (its type map, in
docs/sinks.md), and the target table ``LIKE`` it, with the record id (upsert: the key)
as primary key.

Its length: one flush is one transaction, and its steps — route, stage, evolve, key,
load or upsert, cover — share the cursor, the tables known and the schemas staged; apart,
each would need all of them.
Nested columns (structs, maps, lists of structs) go in as JSON text. New columns are
added with ``ALTER TABLE``; a column whose type changed is a :class:`SinkSchemaError`.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import adbc_driver_postgresql.dbapi as pg
import pyarrow as pa

from thalweg.config.sinks import PostgresSinkConfig
from thalweg.records import unavailable
from thalweg.records.columns import RECORD_ID_TYPE, MetadataColumns
from thalweg.records.ranges import merge_ranges
from thalweg.records.unavailable import UNAVAILABLE
from thalweg.sinks import routes
from thalweg.sinks.base import (
    BufferedSink,
    Landed,
    Ranges,
    SinkError,
    SinkRefusedError,
    SinkSchemaError,
    SinkUnavailableError,
)
from thalweg.sinks.contract import Capabilities, Held
from thalweg.sinks.fold import DELETED, newest_per_key

log = logging.getLogger(__name__)

COVERAGE_TABLE = "_thalweg_coverage"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresSink(BufferedSink[PostgresSinkConfig]):
    kind = "postgres"
    guarantee = "exactly-once"
    capabilities = Capabilities(
        upsert=True,
        routing=True,
        refuses_values=True,
        reads_back=True,
        rebuilds_dropped=True,
        detects_deleted_rows=True,
        evolves_schema=True,
        widens_types=True,
        describes_tables=True,
    )

    def __init__(
        self, cfg: PostgresSinkConfig, data_dir: Path, columns: MetadataColumns | None = None
    ) -> None:
        super().__init__(cfg, data_dir, columns)
        self._conn: Any = None
        self._record_id = self.columns.record_id
        # A node's derived rows (docs/pipeline.md): a row's index among its record's rows.
        self._derived_index = self.columns.prefix + "derived_index"
        self._position = self.columns.position
        self._upsert = getattr(cfg, "mode", "append") == "upsert"
        # A table per value of a row's field ("{tenant}_orders", sinks/routes.py): the
        # tables made so far, counted against max_tables.
        self.routed = routes.routed(cfg.table)
        self._tables: set[str] = set()
        self._key: list[str] = cfg.row_key(self.columns.source("key")) if self._upsert else []
        # Keyed by the record key, the rows came with their value (a tombstone deletes):
        # its bytes stay only when the sink's metadata asks for them.
        self._keep_value = "source_value" in cfg.metadata
        # Per table, the schema of rows a staged load took (this transaction / committed).
        self._staged: dict[str, pa.Schema] = {}
        self._direct: dict[str, pa.Schema] = {}

    def table_name(self, topic: str) -> str:
        """The table of ``topic`` (a table template naming no column)."""
        return routes.safe_name(self.cfg.table.replace("{topic}", topic))

    def holds(self, wanted: list[str]) -> Held:
        """The coverage table's rows of this sink and the ``wanted`` columns of each
        table it writes (``sinks/postgres_held.py``)."""
        from thalweg.sinks.postgres_held import read_held

        return read_held(self, wanted)

    def rebuild_step(self) -> str:
        return (
            "stop the sink's feeder, delete the sink's rows of _thalweg_coverage for the "
            "topic and data_dir/coverage/<sink>.json, and run twg recover again (the rows "
            "still there are skipped by record id)"
        )

    def tables_of(self, cur: Any, topic: str) -> list[str]:
        """The tables of ``topic`` in the schema: its one table, or with a routed
        template every table the template can name."""
        if not self.routed:
            return [self.table_name(topic)]
        cur.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
            parameters=(self.cfg.schema_name,),
        )
        like = routes.pattern(self.cfg.table, topic)
        return sorted(str(r[0]) for r in cur.fetchall() if like.match(str(r[0])))

    def _qualified(self, name: str) -> str:
        return f"{quote_ident(self.cfg.schema_name)}.{quote_ident(name)}"

    def _connect(self) -> Any:
        if self._conn is None:
            self._conn = pg.connect(self.cfg.dsn.get_secret_value())
        return self._conn

    def _drop(self) -> None:
        self._direct = {}  # a new connection checks each table again
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a broken connection may not close cleanly
                log.debug("postgres sink %s: close failed", self.name, exc_info=True)

    def _open(self) -> Landed | None:
        self._drop()
        try:
            conn = self._connect()
            with conn.cursor() as cur:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(self.cfg.schema_name)}")
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._qualified(COVERAGE_TABLE)} ("
                    "sink text NOT NULL, topic text NOT NULL, partition integer NOT NULL, "
                    "epoch integer NOT NULL, ranges jsonb NOT NULL, "
                    "PRIMARY KEY (sink, topic, partition, epoch))"
                )
                cur.execute(
                    f"SELECT topic, partition, epoch, ranges::text FROM "
                    f"{self._qualified(COVERAGE_TABLE)} WHERE sink = $1",
                    parameters=(self.name,),
                )
                found = cur.fetchall()
                self._tables = {t for topic in self.cfg.topics for t in self.tables_of(cur, topic)}
                # A routed sink's tables are made on first sight: a missing one is new.
                topics = set() if self.routed else {str(row[0]) for row in found}
                lost = self._lost_tables(cur, topics)
                found = [row for row in found if row[0] not in lost]
            conn.commit()
        except pg.Error as exc:
            self._drop()
            raise SinkUnavailableError(f"postgres sink {self.name!r}: {_first_line(exc)}") from exc
        ranges: Ranges = {}
        for topic, partition, epoch, text in found:
            if topic in self.cfg.topics:
                ranges[(topic, int(partition), int(epoch))] = [
                    (int(a), int(b)) for a, b in json.loads(text)
                ]
        return Landed(ranges)

    def _exists(self, cur: Any, table: str) -> bool:
        cur.execute("SELECT to_regclass($1) IS NOT NULL", parameters=(self._qualified(table),))
        row = cur.fetchone()
        return bool(row and row[0])

    def _lost_tables(self, cur: Any, topics: set[str]) -> set[str]:
        """Topics whose coverage rows claim positions while their table is gone (dropped,
        restored from an older backup): the claims go, in the transaction of the open,
        so the feeder replays those positions from the lane and rebuilds the table —
        never a recovery reporting success over a table that is not there."""
        lost = {
            t for t in topics if t in self.cfg.topics and not self._exists(cur, self.table_name(t))
        }
        for topic in sorted(lost):
            log.warning(
                "postgres sink %s: table %s is missing while its coverage claims positions; "
                "the claims are dropped and the table rebuilt from the lane",
                self.name,
                self._qualified(self.table_name(topic)),
            )
            cur.execute(
                f"DELETE FROM {self._qualified(COVERAGE_TABLE)} WHERE sink = $1 AND topic = $2",
                parameters=(self.name, topic),
            )
        return lost

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        tables = self._routes(
            {
                t: _postgres_types(
                    pa.concat_tables(parts, promote_options="permissive"),
                    keep=(UNAVAILABLE,) if self._upsert else (),
                )
                for t, parts in rows.items()
            }
        )
        try:
            try:
                self._transaction(tables, covered, staged=False)
            except (pg.IntegrityError, pg.ProgrammingError) as exc:
                # A row already there (the table written by someone else, or the offsets
                # table lost) or a column that changed: again, through the staging table
                # that deduplicates and names a schema change.
                log.info("postgres sink %s: direct load refused (%s)", self.name, _first_line(exc))
                self._rollback()
                self._transaction(tables, covered, staged=True)
        except SinkError:
            self._rollback()
            raise
        except pg.DataError as exc:
            # A value the table cannot hold (a NUL in text, out of range): retrying
            # cannot help; the sink is degraded and the records stay in the raw lane.
            self._rollback()
            raise SinkRefusedError(f"postgres sink {self.name!r}: {_first_line(exc)}") from exc
        except pg.Error as exc:
            self._rollback()
            self._drop()
            raise SinkUnavailableError(f"postgres sink {self.name!r}: {_first_line(exc)}") from exc

    def _routes(self, by_topic: Mapping[str, pa.Table]) -> dict[tuple[str, str], pa.Table]:
        """Each table's rows per topic: one table per topic, or with a routed template a
        table per value of the rows' fields (``routes.assign``: rows naming none, or one
        table past ``max_tables``, refused by name)."""
        if not self.routed:
            return {(self.table_name(t), t): data for t, data in by_topic.items()}
        cfg = self.cfg
        return routes.assign(
            by_topic,
            cfg.table,
            self._tables,
            cfg.max_tables,
            self.name,
            self.columns,
            deletes_name_nothing=self._upsert,
        )

    def _transaction(
        self, tables: Mapping[tuple[str, str], pa.Table], covered: Ranges, *, staged: bool
    ) -> None:
        """One transaction: every topic's rows, then the covered ranges.

        Direct (``staged=False``): binary COPY straight into a table that a staged load
        of the same schema prepared — the rows come only from positions the offsets
        table, committed with them, says are missing, so they cannot be there already;
        the primary key refuses the COPY if they are, and the staged path runs instead.
        Staged: into a temporary table, then ``INSERT … ON CONFLICT DO NOTHING`` (new
        tables, new columns and changed types are checked and applied on this path)."""
        conn = self._connect()
        self._staged = {}
        with conn.cursor() as cur:
            for (name, topic), data in tables.items():
                if self._upsert:
                    self._load_upserts(cur, name, topic, data)
                elif staged or not self._load_direct(cur, name, data):
                    self._load(cur, name, topic, data)
            for key, rs in covered.items():
                self._cover(cur, key, rs)
        conn.commit()
        self._direct.update(self._staged)
        self._tables.update(name for name, _ in tables)

    def _load_direct(self, cur: Any, name: str, data: pa.Table) -> bool:
        """COPY straight into the table when a staged load of rows with exactly this
        schema has succeeded on it (so the table has the columns, types and key the
        rows need); False to take the staged path."""
        if self._direct.get(name) != data.schema:
            return False
        cur.adbc_ingest(name, data, mode="append", db_schema_name=self.cfg.schema_name)
        return True

    def _staged_into(
        self, cur: Any, name: str, topic: str, data: pa.Table, key: list[str]
    ) -> tuple[str, str, bool]:
        """Stage ``data`` and make the target table take it: created ``LIKE`` the stage,
        keyed by ``key``, new columns added and types widened. ``(target, stage,
        exact)``: ``exact`` when every column has exactly the staged type."""
        stage = "_thalweg_stage"
        cur.execute(f"DROP TABLE IF EXISTS pg_temp.{quote_ident(stage)}")
        cur.adbc_ingest(stage, data, mode="create", temporary=True)
        target = self._qualified(name)
        if self._missing_with_claims(cur, name, topic):
            # Dropped under a running feeder: the rows its coverage claims are gone, and
            # writing on would hide that. Reopening drops the claims and replays them.
            raise SinkUnavailableError(
                f"postgres sink {self.name!r}: table {target} is missing while its coverage "
                "claims positions; reopening to rebuild it from the lane"
            )
        cur.execute(f"CREATE TABLE IF NOT EXISTS {target} (LIKE pg_temp.{quote_ident(stage)})")
        self._ensure_key(cur, target, key)
        exact = self._evolve(cur, name, stage)
        self._describe(cur, target, topic, data.schema)
        return target, stage, exact

    def _describe(self, cur: Any, target: str, topic: str, schema: pa.Schema) -> None:
        """``COMMENT ON`` the table and its columns of ``schema`` where the topic's docs
        differ from what they say (ADR 0042): the description, then the properties and
        tags as ``key=value`` lines (PostgreSQL keeps no table properties)."""
        docs = self.table_docs(topic)
        if not docs.speaks_of(schema):
            return
        cur.execute(
            "SELECT a.attname, col_description(a.attrelid, a.attnum), "
            "obj_description(a.attrelid, 'pg_class') FROM pg_attribute a "
            "WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            parameters=(target,),
        )
        rows = cur.fetchall()
        have = {str(r[0]): r[1] for r in rows}
        lines = [docs.description or "", *(f"{k}={v}" for k, v in docs.table_properties().items())]
        comment = "\n".join(lines).strip()
        if comment and (rows[0][2] if rows else None) != comment:
            cur.execute(f"COMMENT ON TABLE {target} IS {_literal(comment)}")
        for column, text in docs.comments(schema).items():
            if column in have and have[column] != text:
                cur.execute(f"COMMENT ON COLUMN {target}.{quote_ident(column)} IS {_literal(text)}")

    def _load(self, cur: Any, name: str, topic: str, data: pa.Table) -> None:
        derived = self._derived_index
        key = [self._record_id] + ([derived] if derived in data.column_names else [])
        target, stage, exact = self._staged_into(cur, name, topic, data, key)
        cols = ", ".join(quote_ident(n) for n in data.column_names)
        cur.execute(
            f"INSERT INTO {target} ({cols}) SELECT {cols} FROM pg_temp.{quote_ident(stage)} "
            f"ON CONFLICT ({', '.join(quote_ident(k) for k in key)}) DO NOTHING"
        )
        cur.execute(f"DROP TABLE pg_temp.{quote_ident(stage)}")
        if exact:
            self._staged[name] = data.schema

    def _load_upserts(self, cur: Any, name: str, topic: str, data: pa.Table) -> None:
        """Fold the rows into the table by ``key``: each key's newest row (lane position)
        of this flush deletes the key's row (``__deleted``) or inserts or updates it;
        neither touches a row the table holds from a newer position. Rows without every
        key column (a tombstone with no image: its delete came as an event before it)
        change nothing."""
        # Folded here, in Arrow: the table is sent at most one row per key.
        data = newest_per_key(
            data, self._key, topic, self.name, self.columns, keep_value=self._keep_value
        )
        if not data.num_rows:
            return
        keeps = unavailable.named(data)
        data = _postgres_types(data)  # __unavailable, kept a list to fold, as JSON text
        target, stage, _ = self._staged_into(cur, name, topic, data, self._key)
        keys = ", ".join(quote_ident(k) for k in self._key)
        same = " AND ".join(f"t.{quote_ident(k)} = n.{quote_ident(k)}" for k in self._key)
        position = quote_ident(self._position)
        older = f"t.{position} < n.{position}"
        if keeps:
            cur.execute(_keep_held(target, stage, keeps, same, older))
        deleted = f"n.{quote_ident(DELETED)}" if DELETED in data.column_names else "false"
        cur.execute(
            f"DELETE FROM {target} t USING pg_temp.{quote_ident(stage)} n "
            f"WHERE {deleted} AND {same} AND {older}"
        )
        cols = ", ".join(quote_ident(n) for n in data.column_names)
        sets = ", ".join(
            f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}"
            for c in data.column_names
            if c not in self._key
        )
        kept = f"NOT coalesce({deleted.removeprefix('n.')}, false)"
        newer = f"{target}.{position} < EXCLUDED.{position}"
        update = f"UPDATE SET {sets} WHERE {newer}" if sets else "NOTHING"
        cur.execute(
            f"INSERT INTO {target} ({cols}) SELECT {cols} FROM pg_temp.{quote_ident(stage)} "
            f"WHERE {kept} ON CONFLICT ({keys}) DO {update}"
        )
        cur.execute(f"DROP TABLE pg_temp.{quote_ident(stage)}")

    def _missing_with_claims(self, cur: Any, name: str, topic: str) -> bool:
        """The table is gone while the topic's coverage claims positions (dropped under
        a running feeder). A routed sink's table may be new: not asked."""
        return not self.routed and not self._exists(cur, name) and self._claims(cur, topic)

    def _claims(self, cur: Any, topic: str) -> bool:
        cur.execute(
            f"SELECT count(*) FROM {self._qualified(COVERAGE_TABLE)} "
            "WHERE sink = $1 AND topic = $2",
            parameters=(self.name, topic),
        )
        row = cur.fetchone()
        return bool(row and row[0])

    def _ensure_key(self, cur: Any, target: str, want: list[str]) -> None:
        """``want`` is the table's primary key (made so on a new table): the record id,
        and for a node's rows its derived index too (one record, several rows); a table
        keyed otherwise cannot deduplicate a replay and is refused as a schema error."""
        cur.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = $1::regclass AND i.indisprimary",
            parameters=(target,),
        )
        key = sorted(r[0] for r in cur.fetchall())
        if not key:
            cols = ", ".join(quote_ident(k) for k in want)
            cur.execute(f"ALTER TABLE {target} ADD PRIMARY KEY ({cols})")
        elif key != sorted(want):
            raise SinkSchemaError(
                f"postgres table {target}: its primary key is {key}, not {sorted(want)}; a "
                "replay could not be deduplicated"
            )

    def _evolve(self, cur: Any, table: str, stage: str) -> bool:
        """Add the staging table's new columns to the target, widen its narrower ones;
        refuse any other change. True when every column now has exactly the staged type
        (then a binary COPY of rows of this schema may go straight into the table)."""
        query = (
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped"
        )
        target = self._qualified(table)
        cur.execute(query, parameters=(f"pg_temp.{quote_ident(stage)}",))
        staged = dict(cur.fetchall())
        cur.execute(query, parameters=(target,))
        have = dict(cur.fetchall())
        exact = True
        for name, kind in staged.items():
            if name not in have:
                cur.execute(f"ALTER TABLE {target} ADD COLUMN {quote_ident(name)} {kind}")
            elif have[name] == kind:
                continue
            elif _fits(kind, have[name]):
                exact = False  # narrower rows: fine through INSERT, not through binary COPY
            elif _fits(have[name], kind):
                cur.execute(f"ALTER TABLE {target} ALTER COLUMN {quote_ident(name)} TYPE {kind}")
            else:
                raise SinkSchemaError(
                    f"postgres table {target}: column {name!r} is {have[name]}, the rows "
                    f"have {kind}; only added columns and widened types are applied: "
                    'change the table (docs/sinks.md, "Schema changes") and the sink '
                    "resumes from its coverage"
                )
        return exact

    def _cover(self, cur: Any, key: tuple[str, int, int], ranges: list[tuple[int, int]]) -> None:
        topic, partition, epoch = key
        table = self._qualified(COVERAGE_TABLE)
        cur.execute(
            f"SELECT ranges::text FROM {table} WHERE sink = $1 AND topic = $2 AND "
            "partition = $3 AND epoch = $4 FOR UPDATE",
            parameters=(self.name, topic, partition, epoch),
        )
        row = cur.fetchone()
        old = [(int(a), int(b)) for a, b in json.loads(row[0])] if row else []
        merged = json.dumps(merge_ranges([*old, *ranges]))
        cur.execute(
            f"INSERT INTO {table} (sink, topic, partition, epoch, ranges) VALUES "
            "($1, $2, $3, $4, $5::jsonb) ON CONFLICT (sink, topic, partition, epoch) "
            "DO UPDATE SET ranges = EXCLUDED.ranges",
            parameters=(self.name, topic, partition, epoch, merged),
        )

    def _rollback(self) -> None:
        if self._conn is not None:
            try:
                self._conn.rollback()
            except Exception:
                self._drop()

    def _close(self) -> None:
        self._drop()


# Widening ladders: a type fits every type to its right.
_LADDERS = (("smallint", "integer", "bigint", "numeric"), ("real", "double precision"))


def _fits(narrow: str, wide: str) -> bool:
    """True when values of Postgres type ``narrow`` go into ``wide`` without loss."""
    return any(
        narrow in ladder and wide in ladder and ladder.index(narrow) < ladder.index(wide)
        for ladder in _LADDERS
    )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _keep_held(target: str, stage: str, keeps: list[str], same: str, older: str) -> str:
    """The statement that gives the staged rows' unavailable columns (``keeps``, named
    in their ``__unavailable``) the value of the row the table holds for the key, and
    leaves named only what that row did not know either."""
    named = f"n.{quote_ident(UNAVAILABLE)}::jsonb"
    held = f"t.{quote_ident(UNAVAILABLE)}::jsonb"
    sets = [
        f"{quote_ident(c)} = CASE WHEN {named} @> {_literal(json.dumps(c))}::jsonb "
        f"THEN t.{quote_ident(c)} ELSE n.{quote_ident(c)} END"
        for c in keeps
    ]
    still = (
        f"(SELECT jsonb_agg(x)::text FROM jsonb_array_elements_text({named}) x "
        f"WHERE coalesce({held} @> to_jsonb(x), false))"
    )
    sets.append(f"{quote_ident(UNAVAILABLE)} = {still}")
    return (
        f"UPDATE pg_temp.{quote_ident(stage)} n SET {', '.join(sets)} FROM {target} t "
        f"WHERE {same} AND {older} AND n.{quote_ident(UNAVAILABLE)} IS NOT NULL"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _postgres_types(table: pa.Table, *, keep: tuple[str, ...] = ()) -> pa.Table:
    """Columns ADBC cannot COPY as they are: the 16-byte record id as bytea, nested
    values as JSON text (bytes inside them base64); ``keep`` as they are (an upsert's
    ``__unavailable``, folded first)."""
    for i, f in enumerate(table.schema):
        t = f.type
        if f.name in keep:
            continue
        if t == RECORD_ID_TYPE or pa.types.is_fixed_size_binary(t):
            table = table.set_column(i, f.name, table.column(i).cast(pa.binary()))
        elif pa.types.is_unsigned_integer(t):
            table = table.set_column(i, f.name, table.column(i).cast(pa.int64()))
        elif _nested(t):
            values = [_json(v) for v in table.column(i).to_pylist()]
            table = table.set_column(i, f.name, pa.array(values, pa.string()))
    return table


def _nested(t: pa.DataType) -> bool:
    if pa.types.is_struct(t) or pa.types.is_map(t) or pa.types.is_union(t):
        return True
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _json(value: object) -> str | None:
    if value is None:
        return None
    return json.dumps(value, default=_bytes, separators=(",", ":"), sort_keys=True)


def _bytes(value: object) -> object:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)
