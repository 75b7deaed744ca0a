"""Regenerate ``vectors/binary.json`` from ``vectors/valid.json`` (run by hand, rarely).

Each valid JSON ticket gets its binary twin, hex-encoded; the invalid binary cases are
built field by field so they stay readable. The files are golden: tests check both
directions against them, so a change in the encoder shows up as a test failure, not as
a silently rewritten vector.
"""

from __future__ import annotations

import json
from pathlib import Path

from thalweg_client.wire.tickets import ReadTicketPb, encode_ticket

HERE = Path(__file__).resolve().parent / "vectors"


def _tag(field: int, wire: int) -> bytes:
    return bytes([field << 3 | wire])


def main() -> None:
    valid = json.loads((HERE / "valid.json").read_text())
    out_valid = [
        {
            "hex": encode_ticket(case["ticket"]).hex(),
            "ticket": case["ticket"],
            "means": case["means"],
        }
        for case in valid
    ]
    base = encode_ticket({"topic": "o"})
    bad_start = ReadTicketPb(version=1, topic="o")
    bad_start.start.SetInParent()  # a Position with nothing set
    invalid = [
        ("unknown top-level field 12", base + _tag(12, 0) + b"\x01", "ticket"),
        ("unknown view number", base + _tag(11, 0) + b"\x07", "view"),
        (
            "unknown field 9 inside start",
            base + _tag(5, 2) + b"\x02" + _tag(9, 0) + b"\x01",
            "start",
        ),
        ("no version", ReadTicketPb(topic="o").SerializeToString(), "v"),
        ("version 2", ReadTicketPb(version=2, topic="o").SerializeToString(), "v"),
        ("unknown lane number 9", base + _tag(3, 0) + b"\x09", "lane"),
        ("unknown metadata number 7", base + _tag(7, 0) + b"\x07", "metadata"),
        ("start with nothing set", bad_start.SerializeToString(), "start"),
        ("start anchor follow", encode_ticket({"topic": "o", "start": "follow"}), "start"),
        ("end offset -1", encode_ticket({"topic": "o", "end": {"offset": -1}}), "end"),
        ("no topic", encode_ticket({}), "topic"),
        ("truncated", encode_ticket({"topic": "orders"})[:-2], "ticket"),
    ]
    doc = {
        "valid": out_valid,
        "invalid": [{"why": w, "hex": b.hex(), "field": f} for w, b, f in invalid],
    }
    (HERE / "binary.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
