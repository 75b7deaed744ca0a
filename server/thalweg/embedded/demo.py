"""Demo data for the quickstart: JSON orders fed into its ``orders`` topic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time

from thalweg.kafka.clients import new_producer

CUSTOMERS = ("ada", "grace", "edsger", "barbara", "donald", "frances", "ken", "radia")
ITEMS = ("anchor", "buoy", "compass", "lantern", "oar", "rope", "sail")


def order(n: int, rng: random.Random) -> dict[str, object]:
    qty = rng.randint(1, 5)
    price = round(rng.uniform(2, 80), 2)
    return {
        "order_id": n,
        "customer": rng.choice(CUSTOMERS),
        "item": rng.choice(ITEMS),
        "quantity": qty,
        "amount": round(qty * price, 2),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


async def produce_orders(
    bootstrap: str, topic: str, rate: float, stop: asyncio.Event, *, seed: int = 7
) -> int:
    """Produce orders at about ``rate`` per second until ``stop``; returns the count."""
    rng = random.Random(seed)
    producer = new_producer(bootstrap, linger_ms=5)
    await producer.start()
    n = 0
    try:
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            o = order(n, rng)
            await producer.send(
                topic,
                json.dumps(o).encode(),
                key=str(o["customer"]).encode(),
                headers=[("source", b"twg-quickstart")],
            )
            n += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        await producer.flush()
    finally:
        await producer.stop()
    return n
