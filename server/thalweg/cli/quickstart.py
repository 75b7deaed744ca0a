"""``twg quickstart``: the whole path on one machine with no external services."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import click

from thalweg.cli.main import run_until_signal
from thalweg.cli.output import emit
from thalweg.config import parse_config
from thalweg.embedded import TansuBroker
from thalweg.embedded.demo import produce_orders
from thalweg.kafka.admin import create_topic

TOPIC = "orders"
PARTITIONS = 3

SNIPPET = """\
Read it from Python (pandas) or DuckDB:

    import thalweg_client
    orders = thalweg_client.connect("{url}").read("orders")      # a pyarrow.Table
    import duckdb; duckdb.sql("select customer, sum(amount) from orders group by 1").show()

Operator endpoints: {admin}/ready  {admin}/metrics
Raw lane (Parquet, Hive layout): {data}/raw/topic=orders/
Ctrl-C stops the producer, the gateway and the broker."""


def run_quickstart(
    ctx: click.Context,
    data_dir: Path,
    flight_port: int,
    http_port: int,
    rate: float,
    duration: float | None,
) -> None:
    from thalweg.engine import Gateway

    with TansuBroker() as broker:
        asyncio.run(create_topic(broker.bootstrap, TOPIC, PARTITIONS))
        cfg = parse_config(
            {
                "gateway": {
                    "data_dir": str(data_dir),
                    "flight_listen": f"grpc://127.0.0.1:{flight_port}",
                    "http_listen": f"127.0.0.1:{http_port}",
                },
                "raw_lane": {"roll_age_s": 2.0},
                "sources": [
                    {
                        "name": "quickstart",
                        "kind": "kafka",
                        "bootstrap_servers": broker.bootstrap,
                        "topics": [TOPIC],
                        "group_id": "thalweg-quickstart",
                        "session_timeout_ms": 6000,
                        "heartbeat_interval_ms": 1000,
                    }
                ],
            },
            origin="quickstart",
        )
        gateway = Gateway(cfg)
        emit(
            ctx,
            f"broker  {broker.bootstrap} (tansu, in memory)\n"
            f"flight  {gateway.flight_url}\n"
            f"admin   {gateway.admin_url}\n\n"
            + SNIPPET.format(url=gateway.flight_url, admin=gateway.admin_url, data=data_dir),
            {
                "broker": broker.bootstrap,
                "flight": gateway.flight_url,
                "admin": gateway.admin_url,
                "data_dir": str(data_dir),
            },
        )

        async def main(stop: asyncio.Event) -> None:
            if duration is not None:
                asyncio.get_running_loop().call_later(duration, stop.set)
            producer = asyncio.create_task(produce_orders(broker.bootstrap, TOPIC, rate, stop))
            try:
                await gateway.run(stop)
            finally:
                stop.set()
                with contextlib.suppress(Exception):
                    await producer

        run_until_signal(main)
    click.echo("stopped", err=True)
