"""What stops a configuration from running here, found before anything runs.

One list for ``twg config validate`` and for the gateway's start, so a configuration
that validates also starts (the two kept separate checks, and a pipeline node feeding
nothing passed validate and was refused at start). Only looks: nothing is created,
bound or connected — whether a port is free is known at start alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thalweg.config.checks import data_dir_problem
from thalweg.config.models import ThalwegConfig
from thalweg.config.pipeline import upstream
from thalweg.contracts import compile_object, load_contract
from thalweg.errors import ConfigError
from thalweg.pipeline.dag import Dag
from thalweg.pipeline.quality import QualityNode
from thalweg.records.columns import MetadataColumns
from thalweg.sinks.loader import load_sink_class


@dataclass(frozen=True, slots=True)
class Preflight:
    """``problems``: each one line naming its key, and each stops a start. ``notes``:
    what runs, but not as the configuration might suggest (contract rules not enforced
    per record)."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def raise_first(self) -> None:
        """Raises:
        ConfigError: the first problem, when there is one."""
        if self.problems:
            raise ConfigError(self.problems[0])


def preflight(cfg: ThalwegConfig) -> Preflight:
    """Every problem of ``cfg`` that can be seen without running it."""
    problems: list[str] = []
    notes: list[str] = []
    problem = data_dir_problem(cfg.gateway.data_dir)
    if problem is not None:
        problems.append(problem)
    for source in cfg.sources:
        if source.contract is None:
            continue
        try:
            contract = load_contract(source.contract)
        except ConfigError as exc:
            problems.append(f"sources.{source.name}.{exc}")
            continue
        for obj in contract.schema_:
            notes += [f"{source.contract}: {u}" for u in compile_object(obj).unenforced]
    problems += _unfed_nodes(cfg)
    dag = Dag.of(cfg.pipeline)
    columns = MetadataColumns(cfg.gateway.metadata_prefix)
    for node in cfg.pipeline.nodes:
        if node.contract is not None:
            try:
                QualityNode(node, dag.source_topic(node.name), columns)
            except ConfigError as exc:
                problems.append(str(exc))
    for sink in cfg.sinks:
        try:
            load_sink_class(sink.kind)
        except ConfigError as exc:
            problems.append(f"sinks.{sink.name}: {exc}")
    return Preflight(problems, notes)


def _unfed_nodes(cfg: ThalwegConfig) -> list[str]:
    """SQL nodes run as transforms feeding sinks; what else a node could be is not built
    yet (docs/status.md): refused rather than accepted and silently not run."""
    nodes = cfg.pipeline.nodes
    dag = Dag.of(cfg.pipeline)
    feeding = {n.name for n in nodes if n.sink is not None or dag.materialised(n.name)}
    by_name = {n.name: n for n in nodes}
    for n in list(feeding):
        feeding.update(upstream(by_name, n))
    return [
        f"pipeline.nodes.{node.name}: nothing is fed from this node (set sink = ..., or "
        "materialise = true for its own lane, which Flight serves)"
        for node in nodes
        if node.name not in feeding
    ]
