"""Thin client for a Thalweg gateway. Depends on pyarrow only.

>>> import thalweg_client
>>> gw = thalweg_client.connect("grpc://127.0.0.1:8815")
>>> gw.topics()
['orders']
>>> table = gw.read("orders")                      # pyarrow.Table, history up to now
>>> reader = gw.stream("orders", end="follow")     # pyarrow.RecordBatchReader
"""

from __future__ import annotations

from thalweg_client.client import Client, connect, ticket

__all__ = ["Client", "connect", "ticket"]
__version__ = "0.1.0"
