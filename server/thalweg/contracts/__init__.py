"""Data contracts (ODCS v3): what a topic's records promise, enforced per record.

``load_contract`` reads the YAML, ``compile_object`` turns one object into vectorised
row checks, ``ContractGuard`` applies them in front of the decoded lane.
"""

from thalweg.contracts.checks import CompiledContract, RowCheck, compile_object
from thalweg.contracts.guard import ContractGuard
from thalweg.contracts.model import DataContract, Property, QualityRule, SchemaObject, load_contract

__all__ = [
    "CompiledContract",
    "ContractGuard",
    "DataContract",
    "Property",
    "QualityRule",
    "RowCheck",
    "SchemaObject",
    "compile_object",
    "load_contract",
]
