"""``[[pipeline.nodes]]``: the transform DAG's nodes (issue 16; ``docs/pipeline.md``).

A node reads a topic's decoded lane or another node and is a DataFusion SQL query over
each micro-batch, a sidecar transform over Flight ``do_exchange``, a data-quality node
enforcing an ODCS contract (``strict``, ``quarantine`` or ``annotate``), or the audit of
such a node (its per-rule verdicts as rows). The
graph's shape — names, ``from``, cycles, sinks — is checked here, with the file; whether
a query plans against its input's schema is checked at start, when the schemas are
known (``thalweg.pipeline.dag``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class NodeConfig(_Model):
    name: str = Field(pattern=_NAME, description="Unique among nodes and topics.")
    from_: str = Field(alias="from", min_length=1, description="A topic, or another node.")
    query: str | None = Field(
        None, description="DataFusion SQL over the input table `input` (per micro-batch)."
    )
    sidecar: str | None = Field(
        None, description="grpc://host:port of a Flight do_exchange transform."
    )
    command: str | None = Field(None, description="The sidecar's command (its transform).")
    token: SecretStr | None = Field(None, description="Bearer token sent to the sidecar.")
    tls_root_certs: Path | None = Field(
        None,
        description="PEM of the CA(s) a grpc+tls:// sidecar's certificate is checked "
        "against (default: the system's roots).",
    )
    contract: Path | None = Field(
        None, description="An ODCS v3 contract this node enforces on its input (DQ node)."
    )
    mode: Literal["strict", "quarantine", "annotate"] = Field(
        "quarantine",
        description="A DQ node: strict stops the node at a broken rule (nothing skipped); "
        "quarantine dead-letters breaking records; annotate adds a verdict column.",
    )
    audit: bool = Field(
        False, description="The per-rule verdicts of the DQ node in `from`, as rows."
    )
    timeout_s: float = Field(30.0, gt=0, description="Per batch, for a sidecar.")
    sink: str | None = Field(None, description="A [[sinks]] name fed from this node.")
    materialise: bool | None = Field(
        None,
        description="Write the node as its own lane; default: when it has more than one "
        "dependent (derived once, not per dependent).",
    )

    @property
    def kind(self) -> str:
        """``sql``, ``sidecar``, ``quality`` or ``audit``."""
        if self.query is not None:
            return "sql"
        if self.sidecar is not None:
            return "sidecar"
        return "quality" if self.contract is not None else "audit"

    @model_validator(mode="after")
    def _one_kind(self) -> NodeConfig:
        given = [self.query is not None, self.sidecar is not None, self.contract is not None]
        if sum(given) + self.audit != 1:
            raise ValueError(
                f"pipeline.nodes.{self.name}: give one of query, sidecar, contract or audit = true"
            )
        if self.sidecar is not None:
            if not self.sidecar.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
                raise ValueError(f"pipeline.nodes.{self.name}: sidecar must be grpc[+tls]://")
            if not self.command:
                raise ValueError(f"pipeline.nodes.{self.name}: a sidecar node needs a command")
            if self.tls_root_certs is not None and not self.sidecar.startswith("grpc+tls://"):
                raise ValueError(
                    f"pipeline.nodes.{self.name}: tls_root_certs needs a grpc+tls:// sidecar"
                )
        return self


WasmType = Literal["int32", "int64", "float32", "float64"]


class UdfConfig(_Model):
    """A WebAssembly function as a SQL scalar function (``docs/pipeline.md``)."""

    name: str = Field(
        pattern=r"^[a-z_][a-z0-9_]*$",
        description="The function's name in node SQL (lower case: SQL folds unquoted names).",
    )
    module: Path = Field(description="A .wasm or .wat file (no WASI: no files, sockets, clock).")
    export: str | None = Field(None, description="The exported function (default: name).")
    args: list[WasmType] = Field(min_length=1)
    returns: WasmType
    fuel: int = Field(
        1_000_000, gt=0, description="Instructions one call may run; a call past it fails."
    )
    max_memory_bytes: int = Field(16 << 20, gt=0, description="Linear memory ceiling.")


def upstream(by_name: Mapping[str, NodeConfig], start: str) -> Iterator[str]:
    """The node names from ``start`` up its chain, ``start`` first when it is a node,
    ending before the topic the chain reads — the one walk of a node chain (sinks,
    materialised lanes, recovery and the config's own checks all ask it). Stops at a
    node already passed: the config refuses cycles, and names them from this walk."""
    seen: set[str] = set()
    up = start
    while up in by_name and up not in seen:
        seen.add(up)
        yield up
        up = by_name[up].from_


def root_topic(by_name: Mapping[str, NodeConfig], start: str) -> str:
    """The topic at the top of ``start``'s chain (``start`` itself when it is one)."""
    chain = list(upstream(by_name, start))
    return by_name[chain[-1]].from_ if chain else start


class PipelineConfig(_Model):
    nodes: list[NodeConfig] = Field(default_factory=list)
    udfs: list[UdfConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _graph(self) -> PipelineConfig:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("pipeline.nodes: two nodes share a name")
        udfs = [u.name for u in self.udfs]
        if len(set(udfs)) != len(udfs):
            raise ValueError("pipeline.udfs: two functions share a name")
        by_name = {n.name: n for n in self.nodes}
        for node in self.nodes:
            if node.audit and (node.from_ not in by_name or by_name[node.from_].contract is None):
                raise ValueError(
                    f"pipeline.nodes.{node.name}: an audit node reads a node with a "
                    f"contract, not {node.from_!r}"
                )
            chain = list(upstream(by_name, node.name))
            end = by_name[chain[-1]].from_
            if end in by_name:  # the walk stopped at a node it had passed
                cycle = " -> ".join([*chain[chain.index(end) :], end])
                raise ValueError(f"pipeline.nodes: a cycle: {cycle}")
        return self
