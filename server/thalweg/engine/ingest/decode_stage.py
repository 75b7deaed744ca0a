"""The decode stage of one source: a fetch's admitted batches → what each partition
buffers and what its follow readers see.

Everything per fetch that costs CPU happens here, on a thread of the stage's own, so the
event loop only fetches, admits and hands on:

* one decoder call per topic for all of the fetch's partitions
  (``pipeline.decode.decode_batches``: a decoder call costs about a millisecond whatever
  it decodes, so 32 partitions decoded one by one spent most of a gateway's CPU);
* the bytes each batch holds, for the buffer bound (``RecordBatch.nbytes`` walks every
  column: ~75 µs a batch, an eighth of the event loop's time at 32 partitions);
* the record sizes the poll budget learns from.

The thread is the stage's own: in the event loop's shared pool the decode queued behind
segment writes, and when every partition rolled at once the live tail stalled for
seconds.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from thalweg.codecs.base import DecodeFailure
from thalweg.engine.ingest.budget import SizeEstimator
from thalweg.errors import SourceError
from thalweg.pipeline.decode import decode_batches
from thalweg.pipeline.decoders import TopicDecoders
from thalweg.records.columns import MetadataColumns
from thalweg.records.file_rows import strip_payload
from thalweg.sources.base import PartitionKey


@dataclass(frozen=True, slots=True)
class Staged:
    """One partition's share of a fetch, ready to buffer and to serve."""

    key: PartitionKey
    raw: pa.RecordBatch
    live: pa.RecordBatch  # what the live tail keeps (file rows: without their payload)
    decoded: pa.Table | None
    failures: tuple[DecodeFailure, ...]
    first: int
    last: int
    raw_bytes: int
    decoded_bytes: int
    payload_bytes: int  # key + value: what the throughput metrics count


class DecodeStage:
    """Decodes and measures one source's fetches, one at a time, off the event loop."""

    def __init__(
        self,
        name: str,
        decoders: TopicDecoders,
        columns: MetadataColumns,
        sizes: SizeEstimator,
    ) -> None:
        self._decoders = decoders
        self._columns = columns
        self._sizes = sizes
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"twg-decode-{name}")

    async def run(self, batches: list[tuple[PartitionKey, pa.RecordBatch, bool]]) -> list[Staged]:
        """Each ``(partition, raw batch, decoded lane?)`` staged, in the same order."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._stage, batches)

    def close(self) -> None:
        self._thread.shutdown(wait=False)

    def _stage(self, batches: list[tuple[PartitionKey, pa.RecordBatch, bool]]) -> list[Staged]:
        c = self._columns
        decoded: list[tuple[pa.Table | None, tuple[DecodeFailure, ...], int]] = [
            (None, (), 0)
        ] * len(batches)
        by_topic: dict[str, list[int]] = {}
        for i, (key, _, wanted) in enumerate(batches):
            if wanted:
                by_topic.setdefault(key[0], []).append(i)
        for topic, idx in by_topic.items():
            decoder = self._decoders.for_topic(topic)
            if decoder is None:
                raise SourceError(f"topic {topic!r} has a decoded lane but no decoder")
            shares = decode_batches(decoder, [batches[i][1] for i in idx], c)
            for i, share in zip(idx, shares, strict=True):
                decoded[i] = (share.table, share.failures, share.nbytes)
        values = [raw.column(c.value) for _, raw, _ in batches]
        keys = [raw.column(c.source("key")) for _, raw, _ in batches]
        self._sizes.observe(pa.chunked_array(values), pa.chunked_array(keys))
        out = []
        for (key, raw, _), (table, failures, dbytes), value, k in zip(
            batches, decoded, values, keys, strict=True
        ):
            offsets = raw.column(c.position)
            out.append(
                Staged(
                    key,
                    raw,
                    strip_payload(raw, c),
                    table,
                    failures,
                    int(offsets[0].as_py()),
                    int(offsets[-1].as_py()),
                    raw.nbytes,
                    dbytes,
                    int(value.nbytes + k.nbytes),
                )
            )
        return out
