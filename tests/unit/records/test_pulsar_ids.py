"""Message ids read in bulk from their bytes equal the client's own getters."""

from __future__ import annotations

import pulsar
import pytest
from hypothesis import given
from hypothesis import strategies as st

from thalweg.records.pulsar_ids import parse_message_ids

# (partition, ledger, entry, batch_index) as pulsar.MessageId takes them.
ids = st.tuples(
    st.integers(-1, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(-1, 2**31 - 1),
)


@given(st.lists(ids, max_size=40))
def test_parts_equal_the_clients_getters(values: list[tuple[int, int, int, int]]) -> None:
    made = [pulsar.MessageId(*v) for v in values]
    parts = parse_message_ids([m.serialize() for m in made])
    assert parts.partition.tolist() == [m.partition() for m in made]
    assert parts.ledger.tolist() == [m.ledger_id() for m in made]
    assert parts.entry.tolist() == [m.entry_id() for m in made]
    assert parts.batch.tolist() == [m.batch_index() for m in made]


def test_fields_it_does_not_read_are_skipped() -> None:
    # As a broker's batched ids carry them: batch_size (6, varint), a packed ack_set (5,
    # length-delimited), a first-chunk id (7, nested) and fixed-width fields 1 and 5.
    body = bytes.fromhex("0805 1007 1803 2002")
    extra = bytes.fromhex("300a 2a03010203 3a0408011002 f9010000000000000000 fd0200000000")
    parts = parse_message_ids([body + extra, body])
    assert parts.ledger.tolist() == [5, 5]
    assert parts.entry.tolist() == [7, 7]
    assert parts.partition.tolist() == [3, 3]
    assert parts.batch.tolist() == [2, 2]


@pytest.mark.parametrize(
    "raw",
    [
        bytes.fromhex("0805"),  # no entry id
        bytes.fromhex("080510ff"),  # the entry id's varint runs past the bytes
        bytes.fromhex("08051007 0b"),  # wire type 3 (a group): unknown here
        bytes.fromhex("08051007 2a05"),  # a delimited field longer than what is left
        bytes.fromhex("08" + "ff" * 10 + "01 1007"),  # a varint longer than 10 bytes
        bytes.fromhex("80"),  # a tag cut off at the end of the bytes
        bytes.fromhex("0801 80"),  # the same after a field
        # a length-delimited field of 2**64 - 11 bytes (negative as int64)
        bytes.fromhex("0a f5ffffffffffffffff01"),
    ],
)
def test_malformed_bytes_are_refused(raw: bytes) -> None:
    good = pulsar.MessageId(0, 1, 2, -1).serialize()
    for ids in ([good, raw, good], [good, raw], [raw]):  # last too: nothing after it
        with pytest.raises(ValueError, match=r"message id|varint"):
            parse_message_ids(ids)


def test_no_ids() -> None:
    assert len(parse_message_ids([]).ledger) == 0
