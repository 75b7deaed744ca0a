"""The read verbs: ``list_flights``, ``get_flight_info``, ``get_schema``, ``do_get`` and
the ``describe-topic`` action.

A ticket (``tickets``) is resolved into positions and a schema (``plan``), split into
endpoints that can be fetched in parallel (``endpoints``) and streamed from Parquet
history into the live tail (``stream``, reading ahead with ``prefetch``). ``service``
holds the verbs' bodies; the server only dispatches to it.
"""
