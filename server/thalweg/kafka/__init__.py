"""Kafka through aiokafka: the only package that builds an aiokafka client.

A source's cluster asks the same of every client that talks to it — its security
protocol, TLS context and SASL credentials — so the consumer (``sources.kafka``), the
``do_put`` producer and the dead-letter topic producer are all built here, from one
place that knows those settings (``clients``). ``producer`` writes records with nothing
lost; ``dlq`` produces dead letters to a topic; ``admin`` makes the quickstart's topic.
Nothing here imports ``thalweg.flight``.
"""
