"""Six gateways on one consumer group and one shared lane, under random faults while
records arrive: kill -9 (then a restart), SIGSTOP past the session (then SIGCONT: a
zombie that wakes up), SIGTERM (then a restart) — actions overlapping, aimed at random.

Afterwards every gateway runs again and the group catches up; then ``twg verify``
against the broker must find every offset of every partition in the lane exactly once,
no overlapping segments, and the group's commits at the broker's end.

``THALWEG_CHAOS_S`` sets how long the faults go on: 45 s in the suite (CI), 180 s for
the issue's three minutes (``THALWEG_CHAOS_S=180 pytest tests/e2e/test_group_chaos.py``,
also what ``make soak`` is for). ``THALWEG_CRASH_SEED`` replays a run's choices.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_replica_faults import lane_offsets, shared_dir, write_config
from tests.helpers import (
    assert_verified,
    committed_offsets,
    group_state,
    produce_until_stopped,
    seeded_rng,
    start_stream,
    wait_until,
)
from thalweg.embedded import TansuBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GATEWAYS = 6
PARTITIONS = 12
SESSION_S = 2.0  # write_config's session_timeout_ms
CHAOS_S = float(os.environ.get("THALWEG_CHAOS_S", "45"))


class Group:
    """The six processes, each restartable; faults are aimed through here."""

    def __init__(self, tmp_path: Path, configs: list[Path]) -> None:
        self.tmp_path, self.configs = tmp_path, configs
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(configs)
        self.stopped: set[int] = set()
        self.lock = threading.Lock()
        self.actions: list[str] = []
        self.timers: list[threading.Timer] = []

    def start(self, i: int) -> None:
        log = self.tmp_path / f"gw{i}.log"
        # aiokafka's info: every join, sync and assignment, should the group not settle.
        self.procs[i] = start_stream(self.configs[i], log, client_level="info")

    def alive(self, i: int) -> bool:
        p = self.procs[i]
        return p is not None and p.poll() is None and i not in self.stopped

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        t = threading.Timer(delay, fn)
        t.daemon = True
        self.timers.append(t)
        t.start()

    def kill(self, i: int, restart_after: float) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.actions.append(f"kill -9 gw{i}")
        self.later(restart_after, lambda: self._restart(i))

    def pause(self, i: int, for_s: float) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        self.stopped.add(i)
        self.actions.append(f"SIGSTOP gw{i} {for_s:.1f}s")
        self.later(for_s, lambda: self._resume(i))

    def term(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        self.actions.append(f"SIGTERM gw{i} (exit {code})")
        assert code == 0, f"gw{i} exited {code} on SIGTERM"
        self._restart(i)

    def _restart(self, i: int) -> None:
        with self.lock:
            self.start(i)

    def _resume(self, i: int) -> None:
        with self.lock:
            proc = self.procs[i]
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            self.stopped.discard(i)

    def settle(self) -> None:
        """Every pending restart and resume done, every gateway running."""
        for t in self.timers:
            t.join(30)
        for i in range(len(self.configs)):
            self._resume(i)
            proc = self.procs[i]
            if proc is None or proc.poll() is not None:
                self._restart(i)

    def stop_all(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                self._resume(i)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def test_six_gateways_under_random_kills_pauses_and_restarts_keep_every_record_once(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="chaos")
    group_id = f"chaos-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    configs = [tmp_path / f"gw{i}.toml" for i in range(GATEWAYS)]
    for i, path in enumerate(configs):
        write_config(path, broker.bootstrap, topic, group_id, shared_dir(data)(f"gw{i}"))
    rng = seeded_rng()
    group = Group(tmp_path, configs)
    stop, sent = threading.Event(), list[int]()
    producer = threading.Thread(
        target=produce_until_stopped,
        args=(broker.bootstrap, topic, PARTITIONS, stop, sent),
        kwargs={"per_tick": 150},  # ~3k records/s
    )
    try:
        for i in range(GATEWAYS):
            group.start(i)
        producer.start()
        ends = time.monotonic() + CHAOS_S
        while time.monotonic() < ends:
            time.sleep(rng.uniform(1.5, 4.0))
            with group.lock:
                running = [i for i in range(GATEWAYS) if group.alive(i)]
                if len(running) <= 2:  # keep a quorum of sorts: faults need survivors
                    continue
                victim = rng.choice(running)
                action = rng.choice(["kill", "kill", "pause", "term"])
            if action == "kill":
                group.kill(victim, restart_after=rng.uniform(0.5, 4.0))
            elif action == "pause":
                group.pause(victim, for_s=SESSION_S + rng.uniform(0.5, 3.0))
            else:
                group.term(victim)
        stop.set()
        producer.join(120)
        group.settle()
        total = sent[0]
        per = {p: len(range(p, total, PARTITIONS)) for p in range(PARTITIONS)}

        def committed() -> dict[int, int]:
            return committed_offsets(broker.bootstrap, group_id, topic, range(PARTITIONS))

        wait_until(
            lambda: committed() == per,
            180,
            lambda: (
                f"all committed: {committed()} of {per}; {group.actions}; "
                + group_state(broker.bootstrap, group_id)
            ),
        )
    finally:
        stop.set()
        group.stop_all()
        if producer.is_alive():
            producer.join(120)
    print(f"{len(group.actions)} faults over {CHAOS_S:.0f} s:", "; ".join(group.actions))
    assert len(group.actions) >= CHAOS_S / 6, group.actions
    seen, overlapping = lane_offsets(data, topic, PARTITIONS)
    assert not overlapping, overlapping[:3]
    want = {(p, o) for p, n in per.items() for o in range(n)}
    twice = [k for k, c in seen.items() if c > 1]
    assert not twice, f"{len(twice)} offsets twice, e.g. {twice[:3]}; {group.actions}"
    assert set(seen) == want, f"missing {len(want - set(seen))}; {group.actions}"
    assert_verified(configs[0], broker=True)
