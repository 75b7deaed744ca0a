"""The transform DAG's shape and its SQL nodes (issue 16; ``docs/pipeline.md``).

The graph comes from ``[[pipeline.nodes]]`` (its shape is checked with the file, in
``thalweg.config.pipeline``); here it is ordered, each node's dependents are known, and
a SQL node is planned against its input's schema — once the schemas are known, at start
— and run by DataFusion over each micro-batch, statelessly.

Every derived row keeps its originating record's locator columns (ADR-0004 in the seed
plan): a query must carry them through — filters (1 → 0), ``unnest`` (1 → N) and
projections alike — and one that drops any is refused at plan time, naming the node and
the columns. ``<prefix>*`` in a query (``select order_id, _twg_* from input``) stands for
every input column with the metadata prefix, which DataFusion has no syntax for.

A :class:`Chain` is the SQL nodes from a topic down to one node, applied in order to a
segment's rows: how a sink attached to a node is fed (``recovery.build``) — its spans are
the topic's positions, so a record is covered for the node only once all its derived rows
landed. Sidecar nodes enter as functions (``sidecar_for``), WebAssembly functions as
DataFusion UDFs (``thalweg.pipeline.udf``). A node that fails on some records — not on
the batch's shape — refuses them: the chain isolates them and hands them back as
:class:`Rejected` beside the rows (``Derived``), for the caller to dead-letter.

Its length: the graph's shape and the SQL node's refusal search belong together; the
search could be a module of its own (issue 36).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datafusion import ScalarUDF, SessionConfig, SessionContext

from thalweg.config.pipeline import NodeConfig, PipelineConfig, root_topic, upstream
from thalweg.errors import ConfigError, InvariantError, ThalwegError
from thalweg.pipeline.quality import QualityNode, verdict_schema
from thalweg.records.columns import MetadataColumns

INPUT = "input"
_MAX_PLANS = 64  # planned (node, input schema) pairs kept per chain
# How a WebAssembly function's failure (thalweg.pipeline.udf) reads through DataFusion.
_UDF_ERROR = re.compile(r"pipeline\.udfs\.\w+: udf_exhausted: [^'\"\\]*")


class RowsRefusedError(ThalwegError):
    """A node refused the rows it was given — a runtime error of its SQL, a WebAssembly
    function out of fuel or memory, a sidecar's error answer. Unlike a sidecar that is
    down, trying again later gives the same answer: the records that cause it are
    dead-lettered (:class:`Rejected`) and the rest go on."""

    reason = "transform"


@dataclass(frozen=True, slots=True)
class Rejected:
    """Records one node refused: their positions (each once), why, and the error — one
    for all, or one per position in ``errors`` (a quality node's messages)."""

    node: str
    reason: str
    error: str
    positions: np.ndarray
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Derived:
    """What a chain made of a batch: the derived rows, and the records refused on the
    way (no row of a refused record reaches the nodes below the one that refused it)."""

    rows: pa.Table
    rejected: tuple[Rejected, ...] = ()


@dataclass(frozen=True, slots=True)
class Dag:
    """The nodes in dependency order (a node after whatever it reads)."""

    nodes: tuple[NodeConfig, ...]

    @staticmethod
    def of(cfg: PipelineConfig) -> Dag:
        by_name = {n.name: n for n in cfg.nodes}
        ordered: list[NodeConfig] = []
        placed: set[str] = set()

        def place(node: NodeConfig) -> None:
            if node.name in placed:
                return
            upstream = by_name.get(node.from_)
            if upstream is not None:
                place(upstream)  # the config refused cycles, so this ends
            placed.add(node.name)
            ordered.append(node)

        for node in cfg.nodes:
            place(node)
        return Dag(tuple(ordered))

    @property
    def by_name(self) -> dict[str, NodeConfig]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def dependents(self, name: str) -> list[str]:
        """The nodes reading ``name``, and its sink when it has one."""
        out = [n.name for n in self.nodes if n.from_ == name]
        node = next((n for n in self.nodes if n.name == name), None)
        if node is not None and node.sink is not None:
            out.append(f"sink:{node.sink}")
        return out

    def materialised(self, name: str) -> bool:
        """Written as its own lane: when configured so, or by default when more than one
        thing reads it (derived once, not once per dependent)."""
        node = self.node(name)
        if node.materialise is not None:
            return node.materialise
        return len(self.dependents(name)) > 1

    def materialised_above(self, name: str, *, include_self: bool) -> str | None:
        """The nearest materialised node on ``name``'s chain up to the topic (``name``
        itself too, with ``include_self``): whose lane whatever is below it reads,
        rather than deriving it again. None when the chain must start at the topic."""
        node = self.node(name)
        # An audit node is its quality node's verdicts, made while that node runs: a
        # chain holding the audit must run the quality node, not read its lane.
        skip = {node.from_} if node.audit and not include_self else set()
        for up in upstream(self.by_name, name if include_self else node.from_):
            above = self.by_name[up]
            if self.materialised(up) and up not in skip:
                return up
            if above.audit:
                skip.add(above.from_)
        return None

    def source_topic(self, name: str) -> str:
        """The topic at the root of ``name``'s chain."""
        return root_topic(self.by_name, name)


def expand_prefix_glob(query: str, schema: pa.Schema, columns: MetadataColumns) -> str:
    """``<prefix>*`` → the input's metadata columns, quoted, comma-separated — outside
    string literals and quoted identifiers, which are kept as written."""
    pattern = re.compile(rf"(?<![\w]){re.escape(columns.prefix)}\*")
    names = ", ".join(f'"{f.name}"' for f in schema if f.name.startswith(columns.prefix))
    # Split into quoted runs ('...' with '' escapes, "...") and the SQL between them.
    parts = re.split(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")""", query)
    return "".join(part if i % 2 else pattern.sub(names, part) for i, part in enumerate(parts))


class SqlNode:
    """One SQL node, planned against its input's schema.

    Raises:
        ConfigError: the query does not plan against the input (the planner's message,
            naming the node), or it drops locator columns the input has.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        input_schema: pa.Schema,
        columns: MetadataColumns,
        udfs: Sequence[ScalarUDF] = (),
    ):
        if cfg.query is None:
            raise InvariantError("cfg.query is not set")
        self.name = cfg.name
        self._udfs = tuple(udfs)
        self.query = expand_prefix_glob(cfg.query, input_schema, columns)
        self._local = threading.local()
        where = f"pipeline.nodes.{cfg.name}"
        try:
            self.schema = self._plan(input_schema.empty_table()).schema
        except Exception as exc:  # DataFusion raises ValueError/Exception with the reason
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise ConfigError(f"{where}: the query does not plan: {message}") from exc
        locators = [f.name for f in columns.locator_fields if f.name in input_schema.names]
        missing = [c for c in locators if c not in self.schema.names]
        if missing:
            raise ConfigError(
                f"{where}: the query drops locator columns {missing}; every derived row "
                f"must keep its record's locators (add them, or {columns.prefix}*)"
            )

    def _context(self) -> SessionContext:
        ctx: SessionContext | None = getattr(self._local, "ctx", None)
        if ctx is None:
            # One partition: a micro-batch is small, rows keep their order (no repartition
            # to undo with a sort), and the ingest has the other cores.
            ctx = SessionContext(SessionConfig().with_target_partitions(1))
            for f in self._udfs:
                ctx.register_udf(f)
            self._local.ctx = ctx
        return ctx

    def _plan(self, table: pa.Table) -> pa.Table:
        ctx = self._context()
        if ctx.table_exist(INPUT):
            ctx.deregister_table(INPUT)
        batches = table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]
        ctx.register_record_batches(INPUT, [batches])
        try:
            result: pa.Table = ctx.sql(self.query).to_arrow_table()
        finally:
            ctx.deregister_table(INPUT)
        return result

    def run(self, batch: pa.Table | pa.RecordBatch) -> pa.Table:
        """The query over one micro-batch (stateless: nothing carries to the next)."""
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        out = self._plan(table)
        if out.schema.types != self.schema.types or out.schema.names != self.schema.names:
            out = out.cast(self.schema)  # a literal's type can follow the batch's values
        return out


class NodeFunction(Protocol):
    """A sidecar node as the chain calls it (``thalweg.sidecars.SidecarClient`` fits):
    the rows derived from ``table``, raising :class:`RowsRefusedError` for rows it
    refuses — after its own retries, or at once with ``retry_refused`` false."""

    def __call__(self, table: pa.Table, *, retry_refused: bool = True) -> pa.Table: ...


class StageObserver(Protocol):
    """Where a chain reports each node's work (``ops.stats.PipelineStats`` fits)."""

    def queued(self, stage: str, depth: int) -> None:
        """``depth`` rows wait in ``stage`` now."""

    def done(self, stage: str, records: int, nbytes: int, seconds: float) -> None:
        """``stage`` returned ``records`` rows (``nbytes``) after ``seconds``."""


class Chain:
    """The nodes from a topic — or from below the materialised node ``below``, whose
    lane is its input — down to ``leaf``, as one function of a batch.

    SQL nodes are planned per input schema (a topic's decoded schema can widen), each
    against the output of the one before it; a sidecar node is the function
    ``sidecar_for`` gives for it (the Flight client lives outside this pure package).

    Raises:
        ConfigError: a sidecar node with no ``sidecar_for``, or — from :meth:`plan` and
            :meth:`apply` — a query that does not plan.
    """

    def __init__(
        self,
        dag: Dag,
        leaf: str,
        columns: MetadataColumns,
        sidecar_for: Callable[[NodeConfig], NodeFunction] | None = None,
        udfs: Sequence[ScalarUDF] = (),
        observer: StageObserver | None = None,
        below: str | None = None,
    ) -> None:
        self._udfs = tuple(udfs)
        self._observer = observer
        path: list[NodeConfig] = []
        for name in upstream(dag.by_name, leaf):
            if name == below:
                break
            path.append(dag.node(name))
        self.leaf = leaf
        self.nodes = tuple(reversed(path))
        self._columns = columns
        self._sidecars: dict[str, NodeFunction] = {}
        self._quality: dict[str, QualityNode] = {}
        self._verdicts: dict[str, pa.Table] = {}  # a quality node's, for its audit
        topic = dag.source_topic(leaf)
        for node in self.nodes:
            if node.kind == "quality":
                self._quality[node.name] = QualityNode(node, topic, columns)
            elif node.kind == "sidecar":
                if sidecar_for is None:
                    raise ConfigError(f"pipeline.nodes.{node.name}: no sidecar client here")
                self._sidecars[node.name] = sidecar_for(node)
        self._plans: dict[tuple[str, pa.Schema], SqlNode] = {}

    def _sql(self, node: NodeConfig, schema: pa.Schema) -> SqlNode:
        key = (node.name, schema)
        planned = self._plans.get(key)
        if planned is None:
            if len(self._plans) >= _MAX_PLANS:  # schemas that keep changing: start over
                self._plans.clear()
            planned = SqlNode(node, schema, self._columns, self._udfs)
            self._plans[key] = planned
        return planned

    def _call(self, node: NodeConfig, table: pa.Table, *, isolating: bool = False) -> pa.Table:
        if node.kind == "sidecar":
            return self._sidecars[node.name](table, retry_refused=not isolating)
        return self._sql(node, table.schema).run(table)

    def _judge(self, node: NodeConfig, table: pa.Table) -> tuple[pa.Table, list[Rejected]]:
        """A quality node: its rows and refusals; its verdicts kept for its audit. An
        audit node: the verdicts of the quality node it reads."""
        if node.kind == "audit":
            verdicts = self._verdicts.pop(node.from_, None)
            return (
                verdict_schema(self._columns).empty_table() if verdicts is None else verdicts
            ), []
        judged = self._quality[node.name].judge(table)
        self._verdicts[node.name] = judged.verdicts
        rejected = [
            Rejected(node.name, reason, errors[0], positions, tuple(errors))
            for reason, positions, errors in judged.refused
        ]
        return judged.rows, rejected

    def _run(self, node: NodeConfig, table: pa.Table) -> tuple[pa.Table, list[Rejected]]:
        """One node over ``table``, reported as stage ``node:<name>``: rows waiting
        while it runs (a sidecar that stops answering shows as a stalled stage), rows
        out and time when it returns. Refused rows are isolated (:meth:`_isolate`)."""
        stage = f"node:{node.name}"
        if self._observer is not None:
            self._observer.queued(stage, table.num_rows)
        started = time.monotonic()
        rejected: list[Rejected] = []
        try:
            if node.kind in ("quality", "audit"):
                out, rejected = self._judge(node, table)
            else:
                try:
                    out = self._call(node, table)
                except Exception as exc:
                    refusal = _refusal(exc)
                    if refusal is None:
                        raise
                    out, rejected = self._isolate(node, table, refusal)
        finally:
            if self._observer is not None:
                self._observer.queued(stage, 0)
        if self._observer is not None:
            self._observer.done(stage, out.num_rows, out.nbytes, time.monotonic() - started)
        return out, rejected

    def _isolate(
        self, node: NodeConfig, table: pa.Table, first: tuple[str, str]
    ) -> tuple[pa.Table, list[Rejected]]:
        """The records of ``table`` that ``node`` refuses, found by halving, and what it
        derives from the others.

        A record's rows stay together (a node below an ``unnest`` sees several rows per
        record). One bad record among n costs about 2·log2(n) calls; the calls are
        bounded, so a batch where most records fail is refused in a few large pieces
        rather than record by record — each refused record is named either way."""
        pos = self._columns.position
        order = pc.sort_indices(table, sort_keys=[(pos, "ascending")])
        table = table.take(order)
        positions = table.column(pos).to_numpy()
        starts = np.flatnonzero(np.r_[True, positions[1:] != positions[:-1]])
        bounds = np.r_[starts, len(positions)]
        records = len(starts)
        budget = 4 * int(np.ceil(np.log2(records + 1))) + 16
        good: list[pa.Table] = []
        rejected: list[Rejected] = []
        pending: list[tuple[int, int, tuple[str, str]]] = [(0, records, first)]
        while pending:
            lo, hi, why = pending.pop()
            if hi - lo > 1 and budget > 0:
                mid = (lo + hi) // 2
                for a, b in ((mid, hi), (lo, mid)):  # popped lo half first: order kept
                    part = table.slice(bounds[a], bounds[b] - bounds[a])
                    budget -= 1
                    try:
                        good.append(self._call(node, part, isolating=True))
                    except Exception as exc:
                        refusal = _refusal(exc)
                        if refusal is None:
                            raise
                        pending.append((a, b, refusal))
                continue
            refused = positions[bounds[lo] : bounds[hi]]
            rejected.append(Rejected(node.name, why[0], why[1], np.unique(refused)))
        if good:
            out = pa.concat_tables(good, promote_options="permissive")
        else:
            out = self._empty_output(node, table)
        return out, rejected

    def _empty_output(self, node: NodeConfig, table: pa.Table) -> pa.Table:
        """No rows, with the node's output schema where it is known (a SQL node's)."""
        if node.kind == "sql":
            return self._sql(node, table.schema).schema.empty_table()
        return table.slice(0, 0)

    def plan(self, schema: pa.Schema) -> pa.Schema | None:
        """Plan the SQL nodes down to the first sidecar (whose output is known only
        from its answers) against ``schema``; the chain's output schema (with
        ``<prefix>derived_index``) when every node could be planned, else None."""
        for node in self.nodes:
            if node.kind == "sidecar":
                return None
            if node.kind == "quality":
                schema = self._quality[node.name].output_schema(schema)
            elif node.kind == "audit":
                schema = verdict_schema(self._columns)
            else:
                schema = self._sql(node, schema).schema
        index = self._columns.prefix + "derived_index"
        if index in schema.names:
            return schema.set(schema.get_field_index(index), pa.field(index, pa.int32()))
        return schema.append(pa.field(index, pa.int32()))

    def apply(self, table: pa.Table) -> Derived:
        """``table`` through every node, derived rows in their records' position order
        (neither a query nor a sidecar need keep row order; the lane's readers need it),
        and the records a node refused."""
        rejected: list[Rejected] = []
        for node in self.nodes:
            table, refused = self._run(node, table)
            rejected += refused
        positions = table.column(self._columns.position).to_numpy()
        step = np.diff(positions)
        if len(step) and (step < 0).any():
            order = pc.sort_indices(table, sort_keys=[(self._columns.position, "ascending")])
            table = table.take(order)
            positions = table.column(self._columns.position).to_numpy()
            step = np.diff(positions)
        # Strictly ascending (a 1 → 1 or 1 → 0 node, the common case): every index is 0.
        unique = not len(step) or bool((step > 0).all())
        return Derived(_with_derived_index(table, self._columns, unique), tuple(rejected))


def _refusal(exc: Exception) -> tuple[str, str] | None:
    """(reason, error) when ``exc`` is a node refusing its rows: a
    :class:`RowsRefusedError`, or DataFusion's error running a planned query (a
    WebAssembly function's failure reaches here inside DataFusion's text). None for
    what is not about the rows — a query that no longer plans, a sidecar that is down,
    a bug — which fails the batch instead (its sink waits, degraded or down)."""
    if isinstance(exc, RowsRefusedError):
        return exc.reason, str(exc)
    text = str(exc).strip()
    if type(exc) is not Exception or not text.startswith("DataFusion error"):
        return None
    udf = _UDF_ERROR.search(text)
    if udf is not None:
        return "udf_exhausted", udf[0].strip()
    return RowsRefusedError.reason, " ".join(text.split())[:500]


def _with_derived_index(
    table: pa.Table, columns: MetadataColumns, unique: bool = False
) -> pa.Table:
    """``<prefix>derived_index``: each row's index among the rows derived from the same
    record (0 for a 1 → 1 node). With the record id it names a derived row — what a
    destination deduplicates a replay by — and it is deterministic: the rows come from
    a stateless query in a stable order."""
    name = columns.prefix + "derived_index"
    n = table.num_rows
    index = np.zeros(n, np.int32)
    if n > 1 and not unique:
        positions = table.column(columns.position).to_numpy()
        starts = np.flatnonzero(np.r_[True, positions[1:] != positions[:-1]])
        lengths = np.diff(np.r_[starts, n])
        index = (np.arange(n) - np.repeat(starts, lengths)).astype(np.int32)
    array = pa.array(index, pa.int32())
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, array)
    return table.append_column(name, array)
