"""``twg batch`` end to end, as a user runs it: real files of every format written here
(malformed ones too), the command in a subprocess, and the lanes read back from disk.

Row counts and content equal the input; a row that does not parse or breaks the
contract is in the dead-letter lane with its file and row number; an unreadable file is
reported and the run goes on (exit 4); a re-run writes nothing twice; a run killed with
SIGKILL twice and resumed writes every row exactly once; a dry run writes nothing.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from tests.helpers import arrow_files, kill_at, safe_count, wait_until
from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

pytestmark = pytest.mark.integration

P = "_twg_"


def twg_batch(
    config: Path, *args: str, output_json: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "thalweg.cli.main"]
    if output_json:
        cmd += ["--output", "json"]
    return subprocess.run(
        [*cmd, "batch", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.strip(), f"no summary; stderr:\n{proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def write_config(tmp_path: Path, topic: str = "drops", extra: str = "", **source: str) -> Path:
    lines = [f"{k} = {v}" for k, v in source.items()]
    text = f"""
[gateway]
data_dir = "{tmp_path / "data"}"
gc_tuning = false

[raw_lane]
roll_age_s = 0.2

[[sources]]
kind = "files"
name = "files"
topics = ["{topic}"]
{chr(10).join(lines)}
{extra}
"""
    path = tmp_path / "thalweg.toml"
    path.write_text(text)
    return path


def lane(data: Path, which: str, topic: str) -> pa.Table:
    """Every segment of one lane of ``topic``, ordered by (partition, position)."""
    root = data / which / f"topic={topic}"
    files = sorted(root.rglob("*.parquet"))
    if not files:
        return pa.table({})
    tables = [pq.read_table(f).replace_schema_metadata(None) for f in files]
    table = pa.concat_tables(tables, promote_options="permissive")
    return table.sort_by([(f"{P}source_partition", "ascending"), (f"{P}position", "ascending")])


def manifest(data: Path, topic: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((data / "batch" / topic / "manifest.json").read_text())
    return body


def rows(n: int, first: int = 0) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f'name {i}, "quoted"' for i in ids], pa.string()),
            "amount": pa.array([i * 0.25 for i in ids], pa.float64()),
        }
    )


AVRO_SCHEMA = {
    "type": "record",
    "name": "row",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}


def write_all_formats(d: Path) -> dict[str, pa.Table]:
    """One file per format (and compression), each with its own rows."""
    d.mkdir(parents=True, exist_ok=True)
    out: dict[str, pa.Table] = {}
    t = rows(150_000, 0)
    pq.write_table(t, d / "a.parquet", row_group_size=40_000)
    out["a.parquet"] = t
    t = rows(1_000, 200_000)
    buf = io.BytesIO()
    pacsv.write_csv(t, buf)
    (d / "b.csv").write_bytes(buf.getvalue().replace(b"\n", b"\r\n"))  # CRLF
    out["b.csv"] = t
    t = rows(2_000, 300_000)
    buf = io.BytesIO()
    pacsv.write_csv(t, buf)
    (d / "c.csv.gz").write_bytes(gzip.compress(buf.getvalue()))
    out["c.csv.gz"] = t
    t = rows(3_000, 400_000)
    lines = "\n".join(json.dumps(r) for r in t.to_pylist()) + "\n"
    (d / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    out["d.jsonl.zst"] = t
    t = rows(4_000, 500_000)
    with open(d / "e.avro", "wb") as f:
        fastavro.writer(f, AVRO_SCHEMA, t.to_pylist(), codec="deflate", sync_interval=16_000)
    out["e.avro"] = t
    t = rows(5_000, 600_000)
    with pa.ipc.new_file(str(d / "f.arrow"), t.schema) as w:
        for b in t.to_batches(max_chunksize=1_500):
            w.write_batch(b)
    out["f.arrow"] = t
    t = rows(6_000, 700_000)
    with pa.ipc.new_stream(str(d / "g.arrows"), t.schema) as w:
        w.write_table(t)
    out["g.arrows"] = t
    return out


def test_every_format_lands_whole_with_its_locators(tmp_path: Path) -> None:
    files = write_all_formats(tmp_path / "in")
    cfg = write_config(tmp_path)
    proc = twg_batch(cfg, str(tmp_path / "in"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(proc)
    total = sum(t.num_rows for t in files.values())
    assert (s["files"], s["files_done"], s["rows"], s["dead_letters"]) == (7, 7, total, 0)

    data = tmp_path / "data"
    decoded, raw = lane(data, "decoded", "drops"), lane(data, "raw", "drops")
    assert decoded.num_rows == raw.num_rows == total
    entries = {
        Path(e["uri"].removeprefix("file://")).name: e for e in manifest(data, "drops")["files"]
    }
    for name, expected in files.items():
        e = entries[name]
        assert (e["state"], e["committed"], e["rows"]) == (
            "done",
            expected.num_rows,
            expected.num_rows,
        )
        part = decoded.filter(pa.compute.equal(decoded[f"{P}source_partition"], e["partition"]))
        got = part.select(["id", "name", "amount"])
        assert got.to_pylist() == expected.to_pylist(), name
        # The locator: the file's URI and each row's number, in the raw lane as well.
        assert part[f"{P}source_offset"].to_pylist() == list(range(expected.num_rows))
        assert set(part[f"{P}source_message_id"].to_pylist()) == {e["uri"].encode()}
        rpart = raw.filter(pa.compute.equal(raw[f"{P}source_partition"], e["partition"]))
        assert rpart[f"{P}record_id"].to_pylist() == part[f"{P}record_id"].to_pylist()
    # Record ids are unique across files.
    assert len(set(raw[f"{P}record_id"].to_pylist())) == total

    # A second run finds every file durable and writes nothing.
    again = twg_batch(cfg, str(tmp_path / "in"))
    assert again.returncode == 0, again.stderr[-3000:]
    s2 = summary(again)
    assert (s2["files_skipped"], s2["rows"]) == (7, 0)
    assert lane(data, "raw", "drops").num_rows == total


def test_excel_sheets_are_read_as_arrow(tmp_path: Path) -> None:
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    assert ws is not None
    ws.append(["city", "population"])
    for city, pop in [("Lyon", 522_250), ("Nantes", 320_732), ("Lille", 236_710)]:
        ws.append([city, pop])
    (tmp_path / "in").mkdir()
    wb.save(tmp_path / "in" / "cities.xlsx")
    cfg = write_config(tmp_path, topic="cities")
    proc = twg_batch(cfg, str(tmp_path / "in" / "cities.xlsx"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    decoded = lane(tmp_path / "data", "decoded", "cities")
    assert decoded["city"].to_pylist() == ["Lyon", "Nantes", "Lille"]
    assert [int(v) for v in decoded["population"].to_pylist()] == [522_250, 320_732, 236_710]


def corrupt_avro(path: Path, n: int) -> int:
    """An Avro container of ``n`` rows whose later blocks are damaged; how many rows a
    reader gets before the damage."""
    buf = io.BytesIO()
    fastavro.writer(buf, AVRO_SCHEMA, rows(n).to_pylist(), codec="deflate", sync_interval=4_000)
    data = bytearray(buf.getvalue())
    for i in range(len(data) * 2 // 3, len(data) * 2 // 3 + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    good = 0
    with contextlib.suppress(Exception):  # fastavro raises at the damage
        for _ in fastavro.reader(io.BytesIO(bytes(data))):
            good += 1
    assert 0 < good < n
    return good


def test_malformed_rows_go_to_the_dead_letter_lane_and_unreadable_files_are_reported(
    tmp_path: Path,
) -> None:
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_text('id,name\n1,one\n2,"two\nlines"\n3,three,extra\n4,four\n')
    (d / "b.jsonl").write_text(
        '{"id": 5, "name": "five"}\n{"id": 6, name\n\n{"id": 7, "name": "seven"}\n'
    )
    pq.write_table(rows(1_000), d / "c.parquet")
    whole = (d / "c.parquet").read_bytes()
    (d / "c.parquet").write_bytes(whole[: len(whole) // 2])  # truncated: no footer
    avro_good = corrupt_avro(d / "d.avro", 3_000)
    (d / "e.csv").write_bytes(b"")  # empty
    (d / "f.jsonl").write_bytes(b"")

    cfg = write_config(tmp_path)
    proc = twg_batch(cfg, str(d))
    assert proc.returncode == 4, proc.stderr[-3000:]  # completed with errors
    s = summary(proc)
    assert s["ok"] is False
    failed = {Path(e["file"].removeprefix("file://")).name for e in s["errors"]}
    assert failed == {"c.parquet", "d.avro"}
    assert s["dead_letter_reasons"] == {"syntax": 2}

    data = tmp_path / "data"
    entries = {
        Path(e["uri"].removeprefix("file://")).name: e for e in manifest(data, "drops")["files"]
    }
    assert entries["a.csv"]["rows"] == 4 and entries["a.csv"]["state"] == "done"
    assert entries["b.jsonl"]["rows"] == 3  # the blank line is not a row
    assert entries["c.parquet"]["state"] == "failed" and entries["c.parquet"]["committed"] == 0
    assert entries["d.avro"]["state"] == "failed"
    assert entries["d.avro"]["committed"] == avro_good  # the rows before the damage stand
    assert entries["e.csv"]["state"] == entries["f.jsonl"]["state"] == "done"

    dead = lane(data, "dlq", "drops")
    assert dead.num_rows == 2
    by_file = {
        Path(m.decode().removeprefix("file://")).name: (off, val, reason)
        for m, off, val, reason in zip(
            dead[f"{P}source_message_id"].to_pylist(),
            dead[f"{P}source_offset"].to_pylist(),
            dead[f"{P}source_value"].to_pylist(),
            dead[f"{P}dlq_reason"].to_pylist(),
            strict=True,
        )
    }
    assert by_file == {
        "a.csv": (2, b"3,three,extra", "syntax"),
        "b.jsonl": (1, b'{"id": 6, name', "syntax"),
    }
    decoded = lane(data, "decoded", "drops")
    a = decoded.filter(
        pa.compute.equal(decoded[f"{P}source_partition"], entries["a.csv"]["partition"])
    )
    assert a["name"].to_pylist() == ["one", "two\nlines", None, "four"]
    assert a[f"{P}decode_error"].to_pylist()[2].startswith("syntax: expected 2 columns, got 3")
    avro = decoded.filter(
        pa.compute.equal(decoded[f"{P}source_partition"], entries["d.avro"]["partition"])
    )
    assert avro["id"].to_pylist() == list(range(avro_good))

    # A re-run tries the failed files again (still damaged), and writes nothing twice.
    again = twg_batch(cfg, str(d))
    assert again.returncode == 4
    assert summary(again)["files_skipped"] == 4
    assert lane(data, "raw", "drops").num_rows == 4 + 3 + avro_good


def test_csv_quote_delimiter_and_null_settings_reach_every_reader(tmp_path: Path) -> None:
    """The source's CSV settings hold for the run, its dry run and its dead letters."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_text("id|note\n1|'a|b'\n-|'it''s'\n3|-\n4|'x'|y\n5|'two\nlines'\n")
    cfg = write_config(tmp_path, csv_delimiter='"|"', csv_quote='"\'"', csv_null_values='["-"]')
    dry = twg_batch(cfg, "--dry-run", str(d))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert (summary(dry)["rows"], summary(dry)["dead_letter_reasons"]) == (5, {"syntax": 1})
    assert not (tmp_path / "data").exists()

    proc = twg_batch(cfg, str(d))
    assert proc.returncode == 0, proc.stderr[-3000:]
    decoded = lane(tmp_path / "data", "decoded", "drops")
    assert decoded["id"].to_pylist() == [1, None, 3, None, 5]
    assert decoded["note"].to_pylist() == ["a|b", "it's", None, None, "two\nlines"]
    assert (
        decoded[f"{P}decode_error"].to_pylist()[3].startswith("syntax: expected 2 columns, got 3")
    )
    dead = lane(tmp_path / "data", "dlq", "drops")
    assert dead[f"{P}source_value"].to_pylist() == [b"4|'x'|y"]
    assert dead[f"{P}source_offset"].to_pylist() == [3]


def test_a_header_that_repeats_a_name_loses_no_column(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_text("id,name,name,\n1,a,b,c\n2,d,e,f\n")
    proc = twg_batch(write_config(tmp_path), str(d))
    assert proc.returncode == 0, proc.stderr[-3000:]
    decoded = lane(tmp_path / "data", "decoded", "drops")
    assert decoded.select(["id", "name", "name_2", "f3"]).to_pylist() == [
        {"id": 1, "name": "a", "name_2": "b", "f3": "c"},
        {"id": 2, "name": "d", "name_2": "e", "f3": "f"},
    ]


def test_a_file_of_a_type_parquet_cannot_hold_is_reported_not_retried_forever(
    tmp_path: Path,
) -> None:
    """Before, an interval column made the decoded lane's writer retry for ever."""
    d = tmp_path / "in"
    d.mkdir()
    iv = pa.array([pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval())
    t = pa.table({"id": [1], "iv": iv})
    with pa.ipc.new_file(str(d / "a.arrow"), t.schema) as w:
        w.write_table(t)
    pq.write_table(rows(10), d / "b.parquet")
    proc = twg_batch(write_config(tmp_path), str(d), timeout=120)
    assert proc.returncode == 4, proc.stderr[-3000:]
    s = summary(proc)
    assert (s["files_done"], s["files_failed"], s["rows"]) == (1, 1, 10)
    assert "month_day_nano_interval" in s["errors"][0]["error"]
    assert lane(tmp_path / "data", "decoded", "drops").num_rows == 10


def contract(tmp_path: Path, topic: str) -> Path:
    path = tmp_path / "contract.yaml"
    doc = {
        "apiVersion": "v3.0.2",
        "kind": "DataContract",
        "id": "drops",
        "version": "1.0.0",
        "schema": [
            {
                "name": topic,
                "properties": [
                    {"name": "id", "logicalType": "integer", "required": True},
                    {
                        "name": "amount",
                        "logicalType": "number",
                        "logicalTypeOptions": {"minimum": 0},
                    },
                ],
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_contract_refuses_typed_rows_into_the_dead_letter_lane_as_json(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    t = pa.table(
        {"id": [1, 2, 3], "amount": [1.5, -2.0, 3.0], "at": pa.array([0, 1, 2], pa.timestamp("ms"))}
    )
    pq.write_table(t, d / "x.parquet")
    cfg = write_config(tmp_path, contract=f'"{contract(tmp_path, "drops")}"')

    dry = twg_batch(cfg, "--dry-run", str(d))
    assert dry.returncode == 0, dry.stderr[-3000:]
    ds = summary(dry)
    assert (ds["dry_run"], ds["rows"], ds["dead_letter_reasons"]) == (True, 3, {"contract": 1})
    assert not (tmp_path / "data").exists()  # a dry run writes nothing

    proc = twg_batch(cfg, str(d))
    assert proc.returncode == 0, proc.stderr[-3000:]
    dead = lane(tmp_path / "data", "dlq", "drops")
    assert dead[f"{P}dlq_reason"].to_pylist() == ["contract"]
    assert dead[f"{P}source_offset"].to_pylist() == [1]
    refused = json.loads(dead[f"{P}source_value"][0].as_py())
    assert refused == {"id": 2, "amount": -2.0, "at": "1970-01-01T00:00:00.001000"}
    decoded = lane(tmp_path / "data", "decoded", "drops")
    assert decoded["id"].to_pylist() == [1, None, 3]


def test_a_run_killed_twice_resumes_and_writes_every_row_exactly_once(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    expected = []
    for i in range(3):
        t = rows(60_000, i * 100_000)
        pacsv.write_csv(t, d / f"part-{i}.csv")
        expected.append(t)
    extra = "max_records_per_s = 40000\nmax_poll_records = 2000"
    cfg = write_config(tmp_path, extra=extra)
    cfg.write_text(
        cfg.read_text().replace("roll_age_s = 0.2", "roll_age_s = 0.2\nroll_rows = 5000")
    )
    data = tmp_path / "data"

    def committed() -> int:
        try:
            return sum(e["committed"] for e in manifest(data, "drops")["files"])
        except (FileNotFoundError, ValueError):
            return 0

    def run() -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "thalweg.cli.main", "batch", "--config", str(cfg), str(d)]
        return subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def second_run_refused() -> None:  # one run per lane topic at a time
        second = twg_batch(cfg, str(d))
        assert second.returncode == 2, second.stderr[-2000:]
        assert "another twg batch run is writing topic 'drops'" in second.stderr

    kill_at(run, committed, (30_000, 110_000), 180_000, while_running=second_run_refused)
    before = committed()
    final = twg_batch(cfg, str(d))
    assert final.returncode == 0, final.stderr[-3000:]
    s = summary(final)
    assert s["rows"] <= 180_000 - before + 5_000 * 3  # resumed, not restarted

    raw, decoded = lane(data, "raw", "drops"), lane(data, "decoded", "drops")
    keys = list(
        zip(
            raw[f"{P}source_partition"].to_pylist(),
            raw[f"{P}source_offset"].to_pylist(),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys)) == 180_000  # every row, none twice
    entries = sorted(manifest(data, "drops")["files"], key=lambda e: e["partition"])
    assert [e["state"] for e in entries] == ["done"] * 3
    for e, t in zip(entries, expected, strict=True):
        part = decoded.filter(pa.compute.equal(decoded[f"{P}source_partition"], e["partition"]))
        assert part.select(["id", "name", "amount"]).to_pylist() == t.to_pylist()


def test_batch_help_and_a_missing_path(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    helped = subprocess.run(
        [sys.executable, "-m", "thalweg.cli.main", "batch", "--help"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert helped.returncode == 0
    assert "Resumable" in helped.stdout and "Exit codes" in helped.stdout
    proc = twg_batch(cfg, str(tmp_path / "nope" / "*.csv"))
    assert proc.returncode == 2
    assert "no such file" in proc.stderr
    assert not (tmp_path / "data").exists()


def test_the_same_contract_and_pipeline_give_a_topic_and_a_file_the_same_rows(
    tmp_path: Path,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    records = [
        {"id": i, "amount": -1.0 if i % 10 == 3 else i * 1.5, "city": f"c{i % 4}"}
        for i in range(500)
    ]
    for r in records:
        producer.produce(topic, json.dumps(r).encode())
    producer.flush(10)
    terms = contract(tmp_path, topic)
    nodes = [
        {
            "name": "big",
            "from": topic,
            "query": "select id, amount, city, _twg_* from input where amount > 100",
            "sink": "big_files",
        }
    ]
    sinks = [
        {"name": "big_files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.3}
    ]
    big = sum(1 for r in records if r["amount"] > 100 and r["amount"] >= 0)
    gw = gateway_factory([topic], contract=str(terms), pipeline={"nodes": nodes}, sinks=sinks)
    gw.wait_durable(topic, {0: 500})
    streamed = gw.data_dir / "sinks" / "big_files"
    wait_until(lambda: safe_count(lambda: arrow_files(streamed).num_rows) == big, 30, "the sink")
    gw.stop()

    d = tmp_path / "in"
    d.mkdir()
    (d / "orders.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = write_config(
        tmp_path,
        topic=topic,
        contract=f'"{terms}"',
        extra=f"""
[[pipeline.nodes]]
name = "big"
from = "{topic}"
query = "select id, amount, city, _twg_* from input where amount > 100"
sink = "big_files"

[[sinks]]
name = "big_files"
kind = "arrow_ipc"
topics = ["{topic}"]
""",
    )
    proc = twg_batch(cfg, str(d))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(proc)
    assert s["dead_letter_reasons"] == {"contract": 50}
    assert s["sinks"]["big_files"]["rows"] == big

    payload = ["id", "amount", "city", f"{P}decode_error"]
    from_topic = lane(gw.data_dir, "decoded", topic).select(payload)
    from_file = lane(tmp_path / "data", "decoded", topic).select(payload)
    assert from_file.to_pylist() == from_topic.to_pylist()
    dead_topic = lane(gw.data_dir, "dlq", topic)
    dead_file = lane(tmp_path / "data", "dlq", topic)
    assert dead_file[f"{P}dlq_error"].to_pylist() == dead_topic[f"{P}dlq_error"].to_pylist()
    sunk = arrow_files(tmp_path / "data" / "sinks" / "big_files").select(["id", "amount", "city"])
    assert (
        sunk.sort_by("id").to_pylist()
        == arrow_files(streamed).select(["id", "amount", "city"]).sort_by("id").to_pylist()
    )


def test_files_in_an_s3_bucket_by_prefix_and_glob(tmp_path: Path, moto: MotoServer) -> None:
    """``s3://`` names through pyarrow.fs, the endpoint and keys from the usual AWS
    environment variables (here: the loopback moto server)."""
    s3: Any = moto.client()
    s3.create_bucket(Bucket="drops")
    expected = []
    for i in range(3):
        t = rows(1_000, i * 10_000)
        buf = io.BytesIO()
        pq.write_table(t, buf)
        s3.put_object(Bucket="drops", Key=f"2026/12/part-{i}.parquet", Body=buf.getvalue())
        expected.append(t)
    s3.put_object(Bucket="drops", Key="2026/12/notes.txt", Body=b"not data")
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    cfg = write_config(tmp_path)

    def run(path: str) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "thalweg.cli.main", "--output", "json", "batch"]
        proc = subprocess.run(
            [*cmd, "-c", str(cfg), path],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return summary(proc)

    assert run("s3://drops/2026/12/part-[01].parquet")["rows"] == 2_000
    s = run("s3://drops/2026/")
    assert (s["files"], s["files_skipped"], s["rows"]) == (3, 2, 1_000)  # notes.txt: no format
    decoded = lane(tmp_path / "data", "decoded", "drops")
    assert sorted(decoded["id"].to_pylist()) == sorted(
        v for t in expected for v in t["id"].to_pylist()
    )
    uris = {m.decode() for m in decoded[f"{P}source_message_id"].to_pylist()}
    assert uris == {f"s3://drops/2026/12/part-{i}.parquet" for i in range(3)}


def test_a_sink_another_process_feeds_is_left_to_it(tmp_path: Path) -> None:
    from thalweg.config import load_config
    from thalweg.lane.layout import LaneLayout
    from thalweg.records.columns import MetadataColumns
    from thalweg.recovery.build import build_feeders

    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(rows(100), d / "a.parquet")
    sink = '[[sinks]]\nname = "lake"\nkind = "arrow_ipc"\ntopics = ["drops"]\n'
    cfg = write_config(tmp_path, extra=sink)
    config = load_config(cfg)
    (tmp_path / "data").mkdir()
    held = build_feeders(  # as a gateway feeding "lake" holds it
        config, LaneLayout(tmp_path / "data"), MetadataColumns(), only="lake"
    )
    assert held
    proc = twg_batch(cfg, str(d))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(proc)
    assert s["rows"] == 100
    assert s["sinks"]["lake"]["fed"] is False
    assert "lake" in s["sinks"]["lake"]["reason"]


def test_a_terminal_gets_a_progress_bar_and_stdout_only_the_summary(tmp_path: Path) -> None:
    import pty

    d = tmp_path / "in"
    d.mkdir()
    for i in range(2):
        pq.write_table(rows(5_000, i * 10_000), d / f"p{i}.parquet")
    cfg = write_config(tmp_path)
    main, terminal = pty.openpty()
    shown: list[bytes] = []

    def drain() -> None:  # read while the child writes: a full pty would block it
        while True:
            try:
                piece = os.read(main, 65536)
            except OSError:  # EIO: the child's side is closed
                return
            if not piece:
                return
            shown.append(piece)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.run(
        [sys.executable, "-m", "thalweg.cli.main", "batch", "--config", str(cfg), str(d)],
        stdout=subprocess.PIPE,
        stderr=terminal,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "160"},
    )
    os.close(terminal)
    reader.join(10)
    os.close(main)
    assert proc.returncode == 0
    text = b"".join(shown).decode(errors="replace")
    assert "files 2/2" in text and "10,000 rows" in text and "rows/s" in text
    out = proc.stdout.decode()
    assert out.startswith("batch into topic drops: 2 of 2 files read")
    assert "files 2/2" not in out


def test_sigint_makes_what_was_read_durable_and_a_rerun_resumes(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    pacsv.write_csv(rows(60_000), d / "a.csv")
    cfg = write_config(tmp_path, extra="max_records_per_s = 20000\nmax_poll_records = 2000")
    data = tmp_path / "data"
    argv = [sys.executable, "-m", "thalweg.cli.main", "--output", "json", "batch", "-c", str(cfg)]
    proc = subprocess.Popen(
        [*argv, str(d)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )

    def committed() -> int:
        try:
            return sum(e["committed"] for e in manifest(data, "drops")["files"])
        except (FileNotFoundError, ValueError):
            return 0

    wait_until(lambda: committed() >= 10_000, 60, "10,000 rows committed")
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    s = json.loads(out.decode().strip().splitlines()[-1])
    assert s["interrupted"] is True and s["ok"] is False
    stopped = committed()
    assert stopped == lane(data, "raw", "drops").num_rows < 60_000  # all it read is durable
    again = twg_batch(cfg, str(d))
    assert again.returncode == 0, again.stderr[-2000:]
    assert summary(again)["rows"] == 60_000 - stopped
    keys = lane(data, "raw", "drops")[f"{P}source_offset"].to_pylist()
    assert sorted(keys) == list(range(60_000))
