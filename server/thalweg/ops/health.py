"""The health tree: components with states, projected onto /live, /ready and /health.

Readiness is gated by the sources and the primary raw lane only: a gateway that ingests
and makes records durable is ready even when a reader or a secondary sink is unhappy.
Liveness asks only that the event loop turns (a broker outage must not get the pod
killed — restarting cannot fix a broker).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class State(StrEnum):
    STARTING = "starting"
    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"


@dataclass(slots=True)
class Component:
    name: str
    kind: str  # "source" | "raw_lane" | "flight" | ...
    gates_readiness: bool
    state: State = State.STARTING
    detail: str = ""
    since: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


class Health:
    """Thread-safe component states plus the event-loop heartbeat."""

    def __init__(self, *, loop_stall_s: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._components: dict[str, Component] = {}
        self._beat = time.monotonic()
        self._loop_stall_s = loop_stall_s

    def register(self, name: str, kind: str, *, gates_readiness: bool) -> None:
        """Add a component (again: its state starts over)."""
        with self._lock:
            self._components[name] = Component(name, kind, gates_readiness, since=time.time())

    def remove(self, name: str) -> None:
        with self._lock:
            self._components.pop(name, None)

    def set(
        self, name: str, state: State, detail: str = "", *, info: dict[str, Any] | None = None
    ) -> None:
        with self._lock:
            c = self._components[name]
            if c.state is not state:
                c.since = time.time()
            c.state, c.detail = state, detail
            if info is not None:
                c.info = dict(info)

    def annotate(self, name: str, **info: Any) -> None:
        """Attach facts to a component's /health entry without changing its state."""
        with self._lock:
            c = self._components.get(name)
            if c is not None:
                c.info.update(info)

    def state(self, name: str) -> State | None:
        with self._lock:
            c = self._components.get(name)
            return None if c is None else c.state

    def beat(self) -> None:
        """Called by the event loop; /live fails when beats stop."""
        self._beat = time.monotonic()

    def live(self) -> bool:
        return time.monotonic() - self._beat < self._loop_stall_s

    def ready(self) -> bool:
        with self._lock:
            gating = [c for c in self._components.values() if c.gates_readiness]
            return bool(gating) and all(c.state is State.UP for c in gating) and self.live()

    def tree(self) -> dict[str, Any]:
        with self._lock:
            comps = {
                c.name: {
                    "kind": c.kind,
                    "state": c.state.value,
                    "detail": c.detail,
                    "since": c.since,
                    "gates_readiness": c.gates_readiness,
                    **({"info": dict(c.info)} if c.info else {}),
                }
                for c in self._components.values()
            }
        return {
            "status": "ready" if self.ready() else ("live" if self.live() else "stalled"),
            "live": self.live(),
            "ready": self.ready(),
            "components": comps,
        }
