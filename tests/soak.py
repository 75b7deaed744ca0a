"""``make soak``: the fault tests again and again, to find the failures one run hides.

Every end-to-end test that aims a fault at the gateway (kill -9, SIGSTOP past a session,
a broker or sink outage, a full disk, hostile input) is run ``--runs`` times, round by
round (each file once per round, so a time budget that ends the soak early leaves every
test with about as many runs), each run a fresh pytest process with fresh random seeds
for the tests that draw them. A failure is kept with its seeds and its output under
``--out`` so it can be replayed (``THALWEG_CRASH_SEED=… pytest FILE``). Not part of CI:
20 rounds take hours on two cores. The summary is a table of runs and failures per test,
printed and written to ``<out>/summary.md``; exit 1 when anything failed.

    python tests/soak.py --runs 20 [--budget-min 120] [--only crash] [--out build/soak]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The fault tests (tests/e2e), each aiming one kind of fault.
FAULT_TESTS = [
    "test_crash_exactness.py",  # kill -9 of ingest
    "test_compaction_crash.py",  # kill -9 mid-merge
    "test_retention_crash.py",  # kill -9 mid-sweep
    "test_upkeep_bucket_crash.py",  # kill -9 of upkeep on a bucket
    "test_dag_crash.py",  # kill -9 of a DAG and its sidecar
    "test_sink_recovery.py",  # a sink outage, kill -9 with sinks
    "test_upsert_crash.py",  # kill -9 and a Postgres outage with upsert sinks
    "test_cdc_conformance.py",  # the change-stream kit into every upsert destination, kill -9
    "test_zombie_writer.py",  # SIGSTOP past the session
    "test_zombie_mid_put.py",  # SIGSTOP mid-PUT, the PUT landing late
    "test_replica_faults.py",  # three replicas: one killed, one paused
    "test_follow_replicas_kill.py",  # a follow stream across a kill
    "test_broker_outage.py",  # the broker down and back
    "test_offsets_backwards.py",  # a broker that comes back with other offsets
    "test_full_disk.py",  # ENOSPC
    "test_schema_bomb.py",  # hostile input
    "test_pulsar_crash.py",  # kill -9 with Pulsar
    "test_pulsar_outage.py",  # the Pulsar broker down and back
    "test_slow_sink.py",  # a sink slower than ingest
    "test_shutdown.py",  # SIGTERM mid-write
    "test_rolling_restart.py",  # SIGTERM and restart of each of three, in turn
    "test_group_chaos.py",  # six gateways: random kill -9, SIGSTOP, SIGTERM
]

STOP_WAIT_S = 60  # an interrupted run's teardown

SEEDS = [
    "THALWEG_CRASH_SEED",
    "THALWEG_DAG_CRASH_SEED",
    "THALWEG_SINK_CRASH_SEED",
    "THALWEG_ZOMBIE_SEED",
]


@dataclass
class Tally:
    runs: int = 0
    failures: list[str] = field(default_factory=list)  # where each failure's output is
    seconds: float = 0.0


def run_once(test: str, out: Path, round_: int) -> tuple[bool, float, Path]:
    seeds = {name: str(random.SystemRandom().randrange(1, 2**31)) for name in SEEDS}
    env = {**os.environ, **seeds}
    log = out / f"{Path(test).stem}.round{round_:02d}.log"
    # A temp root of its own: pytest sessions sharing /tmp/pytest-of-<user> prune each
    # other's numbered directories (a soak beside a test run lost a Postgres data dir
    # mid-test). Kept with the log when the run fails: the gateways' logs are in it.
    basetemp = out / f"{Path(test).stem}.round{round_:02d}.tmp"
    started = time.monotonic()
    with log.open("w") as fh:
        fh.write(" ".join(f"{k}={v}" for k, v in seeds.items()) + f" pytest tests/e2e/{test}\n")
        fh.flush()
        run = subprocess.Popen(
            [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                f"--basetemp={basetemp}", f"tests/e2e/{test}",
            ],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            # A session of its own: a terminal's Ctrl-C reaches the soak alone, which
            # passes on exactly one interrupt (a second one would cut the teardown short).
            start_new_session=True,
        )  # fmt: skip
        try:
            code = run.wait()
        except SoakStoppedError:
            # The run in flight is interrupted too, so its fixtures stop the brokers and
            # gateways they started (killed, they were left running); any signal after
            # the first is ignored meanwhile.
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                _kill_tree(run.pid)  # its brokers and gateways too, in their own sessions
                run.wait()
            _forget(log, basetemp)  # neither passed nor failed: not kept
            raise
    took = time.monotonic() - started
    if code == 0:
        _forget(log, basetemp)  # only failures are kept
    return code == 0, took, log


class SoakStoppedError(Exception):
    """SIGINT or SIGTERM reached the soak; ``code`` is the exit status it ends with."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


def _stop(signum: int, _frame: object) -> None:
    raise SoakStoppedError(signum)


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (found through /proc by parent: the
    brokers start sessions of their own, so a process group would miss them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    todo, found = [pid], []
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    for p in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _forget(log: Path, basetemp: Path) -> None:
    log.unlink(missing_ok=True)
    shutil.rmtree(basetemp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="rounds (each test once per round)")
    ap.add_argument("--budget-min", type=float, default=None, help="stop after this long")
    ap.add_argument("--only", default="", help="only test files whose name contains this")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "soak")
    args = ap.parse_args()
    tests = [t for t in FAULT_TESTS if args.only in t]
    if not tests:
        ap.error(f"no fault test matches {args.only!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_min * 60 if args.budget_min else float("inf")
    tally = {t: Tally() for t in tests}
    began = time.monotonic()
    stopped: SoakStoppedError | None = None
    # SIGINT or SIGTERM ends the soak with a summary of the runs done, even when it was
    # started in the background of a script (which starts it with SIGINT ignored).
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        for round_ in range(1, args.runs + 1):
            if time.monotonic() >= deadline:
                print(f"time budget spent after {round_ - 1} rounds", flush=True)
                break
            for test in tests:
                ok, took, log = run_once(test, args.out, round_)
                t = tally[test]
                t.runs += 1
                t.seconds += took
                if not ok:
                    t.failures.append(str(log))
                print(f"round {round_:2d} {test:34s} {'ok' if ok else 'FAILED'} {took:6.1f} s",
                      flush=True)  # fmt: skip
    except SoakStoppedError as exc:
        stopped = exc
        print(f"stopped by {exc}: the run in flight is not counted", flush=True)
    lines = [
        f"# Soak: {sum(t.runs for t in tally.values())} runs in "
        f"{(time.monotonic() - began) / 60:.0f} min{' (stopped)' if stopped else ''}",
        "",
        # Soaks of one version add up: the commit says which (and whether the tree held
        # changes of its own).
        f"Code: {_version()}",
        "",
        "| test | runs | failed | mean s | failures (logs, with seeds) |",
        "|---|---|---|---|---|",
    ]
    for test, t in tally.items():
        mean = t.seconds / t.runs if t.runs else 0.0
        lines.append(
            f"| {test} | {t.runs} | {len(t.failures)} | {mean:.0f} | {', '.join(t.failures)} |"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "summary.md").write_text(text)
    print(text)
    if any(t.failures for t in tally.values()):
        return 1
    return stopped.code if stopped else 0


def _version() -> str:
    """The commit soaked, marked when the working tree differs from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], check=False, cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown (no git)"
    return f"{head or 'unknown'}{' with uncommitted changes' if dirty else ''}"


if __name__ == "__main__":
    sys.exit(main())
