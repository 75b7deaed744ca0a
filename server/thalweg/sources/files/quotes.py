"""Which newlines of a CSV buffer end records, read the way pyarrow's parser reads quotes.

The cheap rule counts quotes: a newline after an even number of them ends a record.
It holds while every quote the count takes for an opening one stands at a field's start
(RFC 4180 files, and every writer that quotes what needs quoting). A quote inside an
unquoted field (``12" pipe``, written by hand) is text to the parser but flips the
count: from there on the count takes newlines for the inside of a value, so a file would
read as one long record until another such quote. :func:`count_holds` tells, in one
vectorised pass over the quotes, whether the count reads a buffer as the parser does;
:func:`newlines_inside` reads it as the parser does — a walk over the quotes in Python,
paid only for the buffers the count misreads.

Both take a buffer that starts at a record's start.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_LF, _CR = 10, 13


def count_holds(arr: npt.NDArray[np.uint8], quotes: npt.NDArray[np.intp], delim: int) -> bool:
    """Whether counting ``quotes`` (their positions in ``arr``) reads ``arr`` as the
    parser does: every quote the count takes to open a value (the first, third, …)
    stands at a field's start — after a delimiter, a line break, or at the start — or
    right after a quote (the second of a doubled quote, which keeps the value open)."""
    openers = quotes[0::2]
    if len(openers) and openers[0] == 0:
        openers = openers[1:]
    if not len(openers):
        return True
    prev = arr[openers - 1]
    quote = arr[quotes[0]]
    ok = (prev == delim) | (prev == _LF) | (prev == _CR) | (prev == quote)
    return bool(ok.all())


def quoted_spans(
    buf: bytes, quotes: npt.NDArray[np.intp], delim: int
) -> tuple[list[int], list[int]]:
    """The quoted values of ``buf`` as the parser reads them, as the positions of their
    opening and closing quotes: a quote opens a value only at a field's start; inside
    one, a doubled quote is a quote and any other closes it (the rest of the field is
    text, quotes too); every other quote is text. A value still open at the end closes
    at ``len(buf)``. A walk over ``quotes`` (their positions) in Python."""
    q = quotes.tolist()
    opens: list[int] = []
    closes: list[int] = []
    field_start = (delim, _LF, _CR)
    i, n = 0, len(q)
    while i < n:
        p = q[i]
        if p and buf[p - 1] not in field_start:
            i += 1  # text: a quote inside an unquoted field
            continue
        j = i + 1
        while j + 1 < n and q[j + 1] == q[j] + 1:
            j += 2  # a doubled quote inside the value
        opens.append(p)
        if j >= n:
            closes.append(len(buf))
            break
        closes.append(q[j])
        i = j + 1
    return opens, closes


def newlines_inside(
    buf: bytes, quotes: npt.NDArray[np.intp], newlines: npt.NDArray[np.int64], delim: int
) -> npt.NDArray[np.bool_]:
    """For each position in ``newlines``, whether the parser reads it inside a quoted
    value (:func:`quoted_spans`)."""
    opens, closes = quoted_spans(buf, quotes, delim)
    if not opens:
        return np.zeros(len(newlines), dtype=bool)
    o = np.asarray(opens, dtype=np.int64)
    c = np.asarray(closes, dtype=np.int64)
    k = np.searchsorted(o, newlines, side="right") - 1
    inside: npt.NDArray[np.bool_] = (k >= 0) & (newlines < c[np.maximum(k, 0)])
    return inside


def ends_inside_quotes(record: bytes, quote: int, delim: int) -> bool:
    """Whether a record (from its start) ends inside a quoted value the parser opened."""
    if quote not in record:
        return False
    quotes = np.flatnonzero(np.frombuffer(record, dtype=np.uint8) == quote)
    _, closes = quoted_spans(record, quotes, delim)
    return bool(closes) and closes[-1] == len(record)
