"""Each sink's table docs per topic, from the contract of the source that reads the
topic (``sinks/table_docs.py``, ADR 0042)."""

from __future__ import annotations

from typing import Any

from thalweg.config.models import ThalwegConfig
from thalweg.contracts.model import DataContract, load_contract
from thalweg.sinks.table_docs import TableDocs, split_tag


def topic_docs(cfg: ThalwegConfig, sink_cfg: Any) -> dict[str, TableDocs]:
    """Per topic of ``sink_cfg``, what its table should say (topics whose source has no
    contract, or whose contract has no object for them, are left out).

    Raises:
        ConfigError: a contract cannot be read.
    """
    out: dict[str, TableDocs] = {}
    for src in cfg.sources:
        path = getattr(src, "contract", None)
        if path is None:
            continue
        contract = load_contract(path)
        for topic in sink_cfg.topics:
            if topic in src.topics and topic not in out:
                docs = of_contract(contract, topic)
                if docs:
                    out[topic] = docs
    return out


def of_contract(contract: DataContract, topic: str) -> TableDocs:
    """What ``contract`` says of ``topic``'s records, as table docs."""
    obj = contract.object_for(topic)
    if obj is None:
        return TableDocs()
    extra = obj.model_extra or {}
    columns = {
        p.name: str(text)
        for p in obj.properties
        if (text := (p.model_extra or {}).get("description"))
    }
    custom = {
        str(c["property"]): str(c.get("value", ""))
        for c in extra.get("customProperties") or []
        if isinstance(c, dict) and "property" in c
    }
    if contract.id:
        custom.setdefault("thalweg.contract.id", contract.id)
    if contract.version:
        custom.setdefault("thalweg.contract.version", contract.version)
    tags = [*((contract.model_extra or {}).get("tags") or []), *(extra.get("tags") or [])]
    description = extra.get("description")
    if isinstance(description, dict):  # ODCS allows {purpose, usage, limitations}
        description = description.get("purpose") or description.get("usage")
    return TableDocs(
        description=str(description) if description else None,
        columns=columns,
        properties=custom,
        tags=dict(split_tag(str(t)) for t in tags),
    )
