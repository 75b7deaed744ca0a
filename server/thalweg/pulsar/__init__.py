"""Pulsar through the official pulsar-client: the only package that builds its clients.

``client`` opens a client with a source's connection settings, and subscribes the
source's consumer; ``producer`` writes records (``do_put`` on a Pulsar source's topic).
Nothing here imports ``thalweg.flight``.
"""
