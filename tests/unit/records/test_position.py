"""The packed Pulsar position: order-preserving, reversible, refusing what does not fit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from thalweg.records.position import (
    BATCH_BITS,
    ENTRY_BITS,
    LEDGER_BITS,
    PositionOverflowError,
    pack_message_id,
    pack_message_ids,
    unpack_position,
)

ids = st.tuples(
    st.integers(0, (1 << LEDGER_BITS) - 1),
    st.integers(0, (1 << ENTRY_BITS) - 1),
    st.integers(-1, (1 << BATCH_BITS) - 1),
)


@given(ids, ids)
def test_positions_sort_like_message_ids(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    def norm(i: tuple[int, int, int]) -> tuple[int, int, int]:
        return (i[0], i[1], max(i[2], 0))  # -1 (not batched) is index 0 of its entry

    pa_, pb = pack_message_id(*a), pack_message_id(*b)
    assert (pa_ < pb) == (norm(a) < norm(b))
    assert (pa_ == pb) == (norm(a) == norm(b))
    assert unpack_position(pa_) == norm(a)
    assert 0 <= pa_ < 1 << 63


def test_vectorised_packing_matches_the_scalar_one() -> None:
    ledger = np.array([0, 5, 1 << 27], np.int64)
    entry = np.array([0, 7, (1 << ENTRY_BITS) - 1], np.int64)
    batch = np.array([-1, 3, 0], np.int64)
    got = pack_message_ids(ledger, entry, batch).tolist()
    assert got == [
        pack_message_id(int(x), int(y), int(z))
        for x, y, z in zip(ledger, entry, batch, strict=True)
    ]


@pytest.mark.parametrize(
    ("ledger", "entry", "batch", "part"),
    [
        (1 << LEDGER_BITS, 0, 0, "ledger id"),
        (0, 1 << ENTRY_BITS, 0, "entry id"),
        (0, 0, 1 << BATCH_BITS, "batch index"),
        (-1, 0, 0, "ledger id"),
    ],
)
def test_an_id_that_does_not_fit_is_refused(ledger: int, entry: int, batch: int, part: str) -> None:
    with pytest.raises(PositionOverflowError, match=part):
        pack_message_id(ledger, entry, batch)
