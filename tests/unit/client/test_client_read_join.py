"""``Client.read`` joins endpoints answered with schemas that grew between plan and fetch.

The server here is a real ``pyarrow.flight`` server on a loopback port whose endpoints
answer as a gateway does while a topic's first records are decoded: the plan's schema
has the metadata columns only, and later endpoints carry the payload columns too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import thalweg_client

META = pa.schema([("_twg_source_offset", pa.int64())])
GROWN = pa.schema([("order_id", pa.int64()), ("amount", pa.float64()), *META])


class _Growing(fl.FlightServerBase):  # type: ignore[misc]
    """Endpoint 0 answered before the first decoded record, 1 and 2 after it."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.tables = [
            META.empty_table(),
            pa.table({"order_id": [1], "amount": [2.5], "_twg_source_offset": [0]}, GROWN),
            pa.table(
                {"order_id": [2], "amount": pa.array([3], pa.int64()), "_twg_source_offset": [1]}
            ),
        ]

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        endpoints = [fl.FlightEndpoint(str(i).encode(), []) for i in range(len(self.tables))]
        return fl.FlightInfo(META, descriptor, endpoints, -1, -1)

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        return fl.RecordBatchStream(self.tables[int(ticket.ticket)])


@pytest.fixture
def server() -> Iterator[_Growing]:
    srv = _Growing()
    try:
        yield srv
    finally:
        srv.shutdown()


def test_a_read_joins_endpoints_whose_schema_grew_and_keeps_every_row(server: _Growing) -> None:
    with thalweg_client.connect(f"grpc://127.0.0.1:{server.port}") as client:
        got = client.read("orders", parallel=3)
    assert got.num_rows == 2
    assert got.schema.field("amount").type == pa.float64()
    assert sorted(got.column("order_id").to_pylist()) == [1, 2]
    assert sorted(got.column("amount").to_pylist()) == [2.5, 3.0]
    assert set(got.column_names) == {"order_id", "amount", "_twg_source_offset"}


def test_a_read_of_no_endpoints_has_the_planned_schema(server: _Growing) -> None:
    server.tables = []
    with thalweg_client.connect(f"grpc://127.0.0.1:{server.port}") as client:
        got = client.read("orders")
    assert got.num_rows == 0
    assert got.schema == META
