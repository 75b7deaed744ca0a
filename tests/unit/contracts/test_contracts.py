"""Data contracts (ODCS v3): loading, and every per-record rule on real decoded batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from thalweg.codecs.base import DecodeReason
from thalweg.codecs.guard import SizeGuard
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.contracts import ContractGuard, compile_object, load_contract
from thalweg.errors import ConfigError
from thalweg.records import MetadataColumns


def write_contract(tmp_path: Path, objects: list[dict[str, Any]], **top: Any) -> Path:
    doc = {"apiVersion": "v3.1.0", "kind": "DataContract", "id": "c1", "schema": objects}
    doc.update(top)
    path = tmp_path / "contract.odcs.yaml"
    path.write_text(yaml.safe_dump(doc), "utf-8")
    return path


def guard_for(tmp_path: Path, obj: dict[str, Any]) -> ContractGuard:
    contract = load_contract(write_contract(tmp_path, [obj]))
    found = contract.object_for("orders")
    assert found is not None
    return ContractGuard(JsonArrowDecoder(MetadataColumns()), compile_object(found))


def decode(guard: ContractGuard, rows: list[dict[str, Any] | bytes | None]) -> dict[int, str]:
    """Row → error text for every failing row (decoding the rows as JSON payloads)."""
    payloads = [r if isinstance(r, bytes) or r is None else json.dumps(r).encode() for r in rows]
    result = guard.decode(pa.array(payloads, pa.binary()))
    assert result.table.num_rows == len(rows)
    errors = result.errors.to_pylist()
    failed = {i: e for i, e in enumerate(errors) if e is not None}
    assert {f.row for f in result.failures} == set(failed)
    for row in failed:  # a refused row is decoded as nothing
        assert all(result.table.column(c)[row].as_py() is None for c in result.table.column_names)
    return failed


def test_required_type_and_bounds(tmp_path: Path) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "properties": [
                {"name": "id", "logicalType": "string", "required": True},
                {
                    "name": "amount",
                    "logicalType": "number",
                    "logicalTypeOptions": {"minimum": 0, "exclusiveMaximum": 1000},
                },
                {"name": "qty", "logicalType": "integer"},
            ],
        },
    )
    failed = decode(
        guard,
        [
            {"id": "a", "amount": 10.5, "qty": 1},
            {"amount": 3, "qty": 1},  # id missing
            {"id": "c", "amount": -1, "qty": 1},  # below minimum
            {"id": "d", "amount": 1000, "qty": 1},  # not below the exclusive maximum
            {"id": "e", "amount": 999.9, "qty": 2},
            None,  # a tombstone is not judged
            {"id": "g", "amount": None, "qty": None},  # optional fields may be null
        ],
    )
    assert failed == {
        1: "contract: id is required",
        2: "contract: amount = -1.0 is below the minimum 0",
        3: "contract: amount = 1000.0 is not below the exclusive maximum 1000",
    }


def test_a_column_of_the_wrong_type_breaks_the_contract(tmp_path: Path) -> None:
    guard = guard_for(
        tmp_path,
        {"name": "orders", "properties": [{"name": "qty", "logicalType": "integer"}]},
    )
    failed = decode(guard, [{"qty": "three"}, {"qty": None}])
    assert failed == {0: "contract: qty = 'three' (string) is not a integer"}


def test_strings_length_and_pattern(tmp_path: Path) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "properties": [
                {
                    "name": "code",
                    "logicalType": "string",
                    "logicalTypeOptions": {"minLength": 2, "maxLength": 4, "pattern": "^[A-Z]+$"},
                }
            ],
        },
    )
    failed = decode(guard, [{"code": "AB"}, {"code": "A"}, {"code": "ABCDE"}, {"code": "ab"}])
    assert failed == {
        1: "contract: code has 1 characters, outside [2, 4]",
        2: "contract: code has 5 characters, outside [2, 4]",
        3: "contract: code = 'ab' does not match '^[A-Z]+$'",
    }


def test_iso_text_is_a_date_and_is_compared_as_one(tmp_path: Path) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "properties": [
                {
                    "name": "day",
                    "logicalType": "date",
                    "logicalTypeOptions": {"minimum": "2024-01-01"},
                }
            ],
        },
    )
    failed = decode(guard, [{"day": "2024-05-01"}, {"day": "2023-12-31"}, {"day": "soon"}])
    assert failed == {
        1: "contract: day = '2023-12-31' is below the minimum '2024-01-01'",
        2: "contract: day = 'soon' (string) is not a date",
    }


def test_nested_properties_follow_struct_fields(tmp_path: Path) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "properties": [
                {
                    "name": "customer",
                    "logicalType": "object",
                    "properties": [
                        {"name": "email", "logicalType": "string", "required": True},
                    ],
                }
            ],
        },
    )
    failed = decode(
        guard, [{"customer": {"email": "a@b"}}, {"customer": {"email": None}}, {"customer": None}]
    )
    assert failed == {
        1: "contract: customer.email is required",
        2: "contract: customer.email is required",
    }


def test_quality_library_rules_judge_one_record(tmp_path: Path) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "properties": [
                {
                    "name": "status",
                    "logicalType": "string",
                    "quality": [
                        {
                            "name": "known status",
                            "type": "library",
                            "metric": "invalidValues",
                            "arguments": {"validValues": ["new", "paid"]},
                            "mustBe": 0,
                        },
                    ],
                },
                {
                    "name": "note",
                    "quality": [
                        {
                            "type": "library",
                            "metric": "missingValues",
                            "arguments": {"missingValues": [None, "", "N/A"]},
                            "mustBe": 0,
                        }
                    ],
                },
                {"name": "ref", "quality": [{"type": "library", "rule": "nullCheck"}]},
            ],
        },
    )
    failed = decode(
        guard,
        [
            {"status": "new", "note": "x", "ref": 1},
            {"status": "lost", "note": "x", "ref": 1},
            {"status": "paid", "note": "N/A", "ref": 1},
            {"status": "paid", "note": "x", "ref": None},
        ],
    )
    assert failed == {
        1: "quality: known status: status = 'lost' is not one of ['new', 'paid']",
        2: "quality: missingValues: note = 'N/A' counts as missing",
        3: "quality: nullCheck: ref is null",
    }


def test_contract_checks_win_over_quality_and_decode_failures_keep_their_reason(
    tmp_path: Path,
) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "properties": [{"name": "id", "logicalType": "integer", "required": True}],
            "quality": [
                {
                    "name": "positive",
                    "type": "custom",
                    "engine": "datafusion",
                    "implementation": "id > 0",
                }
            ],
        },
    )
    failed = decode(guard, [{"id": 5}, {"id": -5}, {}, b"{not json"])
    assert failed[1] == "quality: positive: id > 0 is false"
    assert failed[2] == "contract: id is required"
    assert failed[3].startswith("syntax: ")
    assert 0 not in failed


def test_sql_expressions_see_every_field_and_null_passes(tmp_path: Path) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "quality": [
                {
                    "name": "total adds up",
                    "type": "custom",
                    "engine": "datafusion",
                    "implementation": "price * qty = total",
                }
            ],
        },
    )
    failed = decode(
        guard,
        [
            {"price": 2, "qty": 3, "total": 6},
            {"price": 2, "qty": 3, "total": 7},
            {"price": 2, "qty": None, "total": 7},  # unknown: passes, as a SQL CHECK does
        ],
    )
    assert failed == {1: "quality: total adds up: price * qty = total is false"}


def test_an_expression_that_cannot_run_dead_letters_with_the_planner_error(
    tmp_path: Path,
) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "quality": [
                {
                    "name": "typo",
                    "type": "custom",
                    "engine": "datafusion",
                    "implementation": "nope > 1",
                }
            ],
        },
    )
    failed = decode(guard, [{"a": 1}, {"a": 2}])
    assert set(failed) == {0, 1}
    assert failed[0].startswith("quality: typo: cannot be evaluated: ")
    assert "nope" in failed[0]


def test_rules_that_need_the_whole_dataset_are_listed_not_enforced(tmp_path: Path) -> None:
    contract = load_contract(
        write_contract(
            tmp_path,
            [
                {
                    "name": "orders",
                    "properties": [
                        {
                            "name": "id",
                            "logicalTypeOptions": {"format": "uuid"},
                            "quality": [
                                {"type": "library", "metric": "duplicateValues", "mustBe": 0},
                                {"type": "library", "metric": "nullValues", "mustBeLessThan": 5},
                            ],
                        }
                    ],
                    "quality": [
                        {
                            "type": "sql",
                            "query": "SELECT COUNT(*) FROM orders",
                            "mustBeGreaterThan": 0,
                        },
                        {"type": "text", "description": "refreshed hourly"},
                    ],
                }
            ],
        )
    )
    obj = contract.object_for("orders")
    assert obj is not None
    compiled = compile_object(obj)
    assert compiled.checks == []
    assert len(compiled.unenforced) == 4
    assert compiled.unenforced[0] == "id: logicalTypeOptions.format"
    assert "duplicateValues" in compiled.unenforced[1]
    assert "nullValues" in compiled.unenforced[2]
    assert "(sql)" in compiled.unenforced[3]


def test_a_size_guard_inside_a_contract_guard_keeps_oversize(tmp_path: Path) -> None:
    contract = load_contract(
        write_contract(
            tmp_path, [{"name": "orders", "properties": [{"name": "id", "required": True}]}]
        )
    )
    obj = contract.object_for("anything")  # one object: every topic
    assert obj is not None
    guard = ContractGuard(SizeGuard(JsonArrowDecoder(MetadataColumns()), 30), compile_object(obj))
    result = guard.decode(
        pa.array([b'{"id": 1}', b'{"id": 2, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxx"}', b"{}"])
    )
    assert [f.reason for f in result.failures] == [DecodeReason.OVERSIZE, DecodeReason.CONTRACT]
    assert DecodeReason.CONTRACT.stage == "contract"
    assert DecodeReason.OVERSIZE.stage == "decode"


def test_objects_match_topics_by_physical_name_then_name(tmp_path: Path) -> None:
    contract = load_contract(
        write_contract(
            tmp_path,
            [
                {"name": "Orders", "physicalName": "orders.v1"},
                {"name": "payments"},
            ],
        )
    )
    assert (found := contract.object_for("orders.v1")) is not None and found.name == "Orders"
    assert (found := contract.object_for("payments")) is not None and found.name == "payments"
    assert contract.object_for("Orders") is None
    assert contract.object_for("other") is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("kind: Nope\napiVersion: v3.0.2\nschema: [{name: a}]\n", "kind is 'Nope'"),
        ("kind: DataContract\napiVersion: v2.2.2\nschema: [{name: a}]\n", "ODCS v3"),
        ("kind: DataContract\napiVersion: v3.0.2\nschema: []\n", "no schema objects"),
        (
            "kind: DataContract\napiVersion: v3.0.2\n"
            "schema: [{name: a, properties: [{name: x, logicalType: money}]}]\n",
            "a.x: logicalType 'money'",
        ),
        ("kind: DataContract\nschema: [{name: a}]\n", "apiVersion"),
        ("- just\n- a list\n", "not a YAML mapping"),
        ("kind: [unclosed\n", "contract "),
    ],
)
def test_bad_contracts_are_config_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text, "utf-8")
    with pytest.raises(ConfigError, match="contract") as err:
        load_contract(path)
    assert needle in str(err.value)


def test_a_rule_that_cannot_be_judged_refuses_the_rows_instead_of_crashing(
    tmp_path: Path,
) -> None:
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "properties": [
                {"name": "code", "logicalTypeOptions": {"minimum": 0}},
                {
                    "name": "status",
                    "quality": [
                        {
                            "name": "known",
                            "metric": "invalidValues",
                            "arguments": {"validValues": [1, 2]},
                        }
                    ],
                },
            ],
        },
    )
    failed = decode(guard, [{"code": "A1", "status": "x"}, {"code": "B2", "status": "y"}])
    assert set(failed) == {0, 1}
    assert failed[0].startswith("contract: code minimum: cannot be evaluated: ")
    # The rows already refused are not judged again; a later batch still is.
    assert decode(guard, [None]) == {}


def test_sql_verdicts_land_on_their_own_rows_in_a_large_batch(tmp_path: Path) -> None:
    """DataFusion runs large inputs in parallel partitions and returns rows out of
    order; a verdict must still land on the row it was made for."""
    guard = guard_for(
        tmp_path,
        {
            "name": "orders",
            "quality": [
                {"name": "even", "type": "custom", "engine": "datafusion",
                 "implementation": "i % 97 <> 13"}
            ],
        },
    )  # fmt: skip
    n = 50_000
    failed = decode(guard, [{"i": i} for i in range(n)])
    assert sorted(failed) == [i for i in range(n) if i % 97 == 13]
