"""Thalweg: an Arrow Flight gateway for Kafka and Pulsar streams.

Layers, lowest first (imports only point downwards; ``tests/unit/house/test_layering.py``
enforces it):

``records``, ``codecs``
    Pure data: the metadata column contract, raw-lane batch building, payload decoding.
    No sockets, no event loop, no server code.
``lane``
    The on-disk raw and decoded Parquet lanes: durable writes, coverage, history reads.
``kafka``, ``pulsar``
    The transports' clients: consumer settings, producers, the dead-letter topic. The
    only places a broker client is built; they import no Flight code.
``sources``
    Transports that yield raw-lane batches (``kafka``, ``pulsar``), on those clients.
``engine``, ``flight``, ``ops``, ``config``, ``cli``
    The running gateway and its operator surface.

Errors form one tree rooted at :class:`thalweg.errors.ThalwegError`::

    ThalwegError (retriable: bool)
    ├── ConfigError          invalid or unsafe configuration
    ├── LaneError            the raw/decoded lane cannot be written or read
    │   └── PrefixMismatchError  lane written with another metadata prefix
    ├── SourceError          a broker client failed (retriable by default)
    ├── DecodeError          one payload could not be decoded (per record)
    └── TicketError          a Flight ticket or descriptor is invalid
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
