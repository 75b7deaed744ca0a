"""The layering gate.

``records`` and ``codecs`` are pure data code: they turn bytes into Arrow and never
import a broker client, a socket, the event loop, or any part of the gateway above them.

The data layers (``records``, ``codecs``, ``contracts`` and ``pipeline``) import no
transport (a broker client or Thalweg's own transport packages), no Flight and no
engine: the same decoding serves a Flight read, a re-decode and a future sink. The
transports (``kafka``, ``pulsar``, ``sources``) import no Flight: the Flight server
uses them, never the other way round. A package of either list is covered as soon as
its directory exists. Every package has the list of packages it may import
(``ALLOWED_PACKAGES``), and a package without one fails the gate.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3] / "server" / "thalweg"
FORBIDDEN_EXTERNAL = {
    "aiokafka",
    "confluent_kafka",
    "pulsar",
    "asyncio",
    "socket",
    "grpc",
    "http",
    "selectors",
    "ssl",
    "subprocess",
}
ALLOWED_INTERNAL = {
    "records": {"thalweg.records", "thalweg.errors"},
    "codecs": {"thalweg.records", "thalweg.codecs", "thalweg.errors"},
}


DATA_LAYERS = ("records", "codecs", "contracts", "pipeline")
TRANSPORTS = ("kafka", "pulsar", "sources")
TRANSPORT_MODULES = (
    "aiokafka",
    "pulsar",
    "confluent_kafka",
    "thalweg.sources",
    "thalweg.kafka",
    "thalweg.pulsar",
)
FLIGHT_MODULES = ("pyarrow.flight", "thalweg.flight")
ENGINE_MODULES = ("thalweg.engine",)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module the text of ``module`` imports, also lazily, relatively or as
    ``from a import b`` (then both ``a`` and ``a.b``, since ``b`` may be a submodule)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            names.add(name)
            names.update(f"{name}.{alias.name}" for alias in node.names)
    return names


def all_imports_of(path: Path) -> set[str]:
    return imports_in(
        path.read_text(encoding="utf-8"), module_of(path), is_package=path.name == "__init__.py"
    )


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def existing(packages: tuple[str, ...]) -> list[str]:
    return [p for p in packages if (ROOT / p).is_dir()]


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    return [
        f"{f.relative_to(ROOT)} imports {name}"
        for f in files
        for name in sorted(all_imports_of(f))
        if within(name, forbidden)
    ]


@pytest.mark.parametrize("package", sorted(ALLOWED_INTERNAL))
def test_pure_layers_import_nothing_above_them(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for f in files:
        for name in imports_of(f):
            top = name.split(".")[0]
            assert top not in FORBIDDEN_EXTERNAL, f"{f.name} imports {name}"
            if top == "thalweg":
                allowed = ALLOWED_INTERNAL[package]
                assert any(name == a or name.startswith(a + ".") for a in allowed), (
                    f"{f.relative_to(ROOT)} imports {name}"
                )


#: Single modules below their package's layer: each may import only the Thalweg modules
#: named here (and no transport); the record cutter not even Arrow (bytes in, offsets out).
PURE_MODULES = {
    "sources/files/formats/records.py": ({"thalweg.sources.files.quotes"}, {"pyarrow"}),
    "sources/files/quotes.py": (set(), {"pyarrow"}),
    "lane/durable.py": (set(), set()),
}


@pytest.mark.parametrize("module", sorted(PURE_MODULES))
def test_pure_modules_import_only_what_they_name(module: str) -> None:
    allowed, also_forbidden = PURE_MODULES[module]
    for name in imports_of(ROOT / module):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_EXTERNAL | also_forbidden, f"{module} imports {name}"
        if top == "thalweg":
            assert name in allowed, f"{module} imports {name}"


def test_client_depends_on_pyarrow_only() -> None:
    client = Path(__file__).resolve().parents[3] / "client" / "thalweg_client"
    for f in client.rglob("*.py"):
        for name in imports_of(f):
            top = name.split(".")[0]
            assert top not in {"thalweg", "aiokafka", "pydantic", "click"}, f"{f.name}: {name}"


def test_the_data_layers_exist() -> None:
    assert {"records", "codecs", "contracts"} <= set(existing(DATA_LAYERS))
    assert existing(TRANSPORTS)


@pytest.mark.parametrize("package", existing(DATA_LAYERS))
def test_data_layers_import_no_transport_flight_or_engine(package: str) -> None:
    found = violations(package, TRANSPORT_MODULES + FLIGHT_MODULES + ENGINE_MODULES)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("package", existing(TRANSPORTS))
def test_transports_import_no_flight(package: str) -> None:
    found = violations(package, ("thalweg.flight",))
    assert not found, "\n".join(found)


#: The Thalweg packages each package may import (besides itself), each edge with the
#: reason it exists. These are floors, not photographs: every edge listed is used (a
#: test fails an edge nothing needs any more), and a new edge needs its reason here.
#: ``errors`` is the one root every layer raises from; ``ops`` (health, metrics,
#: retries, tracing) is a leaf every runtime layer may use.
ERR = "raises the one error tree (errors.py)"
EDGES: dict[str, dict[str, str]] = {
    # the data layers, bottom up
    "records": {"errors": ERR},
    "codecs": {"errors": ERR, "records": "decodes into the raw lane's Arrow shapes"},
    "contracts": {"codecs": "a contract's schema is a codec's", "errors": ERR},
    "config": {"errors": ERR, "records": "validates the metadata prefix and column names"},
    "ops": {},
    "group": {},
    "registry": {
        "codecs": "fetched schemas become decoders",
        "config": "the registry's own section (URL, auth, timeouts)",
        "errors": ERR,
    },
    "lane": {
        "codecs": "a decoded twin is written by the topic's decoder",
        "config": "the raw lane's section (roll sizes, compression)",
        "errors": ERR,
        "records": "segments hold the raw lane's columns",
    },
    "pipeline": {
        "codecs": "re-decodes raw rows", "config": "its [pipeline] section",
        "contracts": "quality nodes run ODCS rules", "errors": ERR,
        "lane": "node lanes and re-decodes read segments", "ops": "node metrics",
        "records": "the metadata columns it keeps", "registry": "re-decoding asks the registry",
    },
    # transports
    "kafka": {
        "config": "its source section (security, timeouts)", "errors": ERR,
        "group": "membership and partition ownership", "records": "fetches into raw batches",
    },
    "pulsar": {
        "config": "its source section", "errors": ERR, "records": "messages into raw batches",
    },
    "embedded": {"errors": ERR, "kafka": "the embedded broker is probed with a client"},
    "sources": {
        "codecs": "a source decodes what it fetches", "config": "its [[sources]] section",
        "errors": ERR, "group": "rebalances", "kafka": "the Kafka source",
        "lane": "resumes from the lane",
        "ops": "source metrics", "pulsar": "the Pulsar source", "records": "raw batches",
    },
    # destinations and what feeds them
    "sinks": {
        "config": "each destination takes its own typed [[sinks]] section",
        "errors": ERR,
        "lane": "durable writes (temp, fsync, rename) and the lane's layout",
        "records": "the metadata columns and coverage ranges",
    },
    "sidecars": {
        "config": "its sidecar section", "errors": ERR, "pipeline": "a sidecar is a pipeline node",
        "records": "the metadata columns it passes through",
    },
    "recovery": {
        "codecs": "re-decodes for a sink", "config": "the [recovery] section and sink tables",
        "errors": ERR, "lane": "reads the lanes it feeds from", "ops": "sink metrics and health",
        "pipeline": "node-fed sinks", "records": "coverage ranges and metadata columns",
        "sidecars": "sinks fed through a sidecar", "sinks": "the destinations it feeds",
        "contracts": "a table's docs come from its topic's contract",
    },
    "verify": {
        "config": "the configuration it checks", "errors": ERR,
        "kafka": "the cluster's offsets and --deep's read-back", "lane": "audits the lanes",
        "records": "positions and metadata columns", "recovery": "coverage stores and dead letters",
        "sinks": "asks each destination what it holds (Sink.holds)",
    },
    # the serving side, the composition roots, the command line
    "flight": {
        "codecs": "decoded schemas", "config": "the Flight section", "errors": ERR,
        "group": "routes reads to the partition's owner", "kafka": "do_put produces to Kafka",
        "lane": "serves the lanes", "ops": "call metrics and tracing", "pulsar": "do_put to Pulsar",
        "records": "tickets name metadata columns", "recovery": "reads a sink's dead letters",
        "registry": "schemas for do_put",
    },
    "engine": {
        "codecs": "decoders per topic", "config": "the whole configuration",
        "contracts": "topic contracts",
        "errors": ERR, "flight": "starts the Flight server", "group": "group membership",
        "lane": "writes the lanes", "ops": "health and metrics", "pipeline": "runs the DAG",
        "records": "raw batches", "recovery": "runs the sink feeders", "sinks": "builds the sinks",
        "sources": "runs the sources",
    },
    "cli": {
        "__version__": "twg --version", "config": "loads and shows the configuration",
        "embedded": "quickstart's broker", "engine": "twg stream and twg batch", "errors": ERR,
        "kafka": "quickstart produces demo data", "lane": "twg lane status and new-epoch",
        "records": "metadata columns", "recovery": "twg recover", "verify": "twg verify",
    },
}  # fmt: skip
ALLOWED_PACKAGES = {package: set(edges) for package, edges in EDGES.items()}


def test_every_package_has_its_list() -> None:
    """A new package is placed in the house before it lands: no package goes unguarded."""
    packages = {d.name for d in ROOT.iterdir() if (d / "__init__.py").exists()}
    assert packages == set(ALLOWED_PACKAGES)


@pytest.mark.parametrize("package", sorted(ALLOWED_PACKAGES))
def test_each_allowed_edge_is_used_and_says_why(package: str) -> None:
    """A floor: an edge nothing imports any more is removed, not kept for later."""
    used = {
        name.split(".")[1]
        for f in (ROOT / package).rglob("*.py")
        for name in all_imports_of(f)
        if name.startswith("thalweg.") and name.split(".")[1] != package
    }
    assert sorted(set(EDGES[package]) - used) == [], f"{package}: edges nothing uses"
    assert all(reason.strip() for reason in EDGES[package].values())


@pytest.mark.parametrize("package", sorted(ALLOWED_PACKAGES))
def test_each_guarded_package_imports_only_what_it_may(package: str) -> None:
    allowed = ALLOWED_PACKAGES[package] | {package}
    found = [
        f"{f.relative_to(ROOT)} imports {name}"
        for f in sorted((ROOT / package).rglob("*.py"))
        for name in sorted(all_imports_of(f))
        if name.startswith("thalweg.") and name.split(".")[1] not in allowed
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import pyarrow.flight as fl", "pyarrow.flight"),
        ("from pyarrow import flight", "pyarrow.flight"),
        ("def f():\n    from thalweg.engine import Gateway", "thalweg.engine"),
        ("from ..flight import server", "thalweg.flight.server"),
        ("from . import kafka", "thalweg.codecs.kafka"),
    ],
)
def test_the_gate_sees_every_form_of_import(source: str, expected: str) -> None:
    assert expected in imports_in(source, "thalweg.codecs.probe")


CLIENT_REQUIRES = {"pyarrow", "google"}  # client/pyproject.toml: pyarrow, protobuf
CLIENT_EXTRAS = {"pandas", "polars", "pyspark"}  # its extras, imported inside functions


def test_client_imports_what_its_distribution_declares() -> None:
    """Module-level imports of ``thalweg_client`` are the standard library, itself and its
    required dependencies; an extra is imported only inside the function needing it."""
    client = Path(__file__).resolve().parents[3] / "client" / "thalweg_client"
    allowed = set(sys.stdlib_module_names) | {"thalweg_client"} | CLIENT_REQUIRES
    for f in sorted(client.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        top_level = {
            alias.name if isinstance(node, ast.Import) else (node.module or "")
            for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        for name in top_level:
            assert name.split(".")[0] in allowed, f"{f.name} imports {name} at module level"
        for name in imports_of(f) - top_level:
            top = name.split(".")[0]
            assert top in allowed | CLIENT_EXTRAS, f"{f.name} imports {name}"


def test_the_client_distribution_requires_pyarrow_and_protobuf_only() -> None:
    project = tomllib.loads(
        (Path(__file__).resolve().parents[3] / "client" / "pyproject.toml").read_text("utf-8")
    )["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\s<>=!~\[;@]", r, maxsplit=1)[0] for r in requirements}

    assert project["name"] == "thalweg-client"
    assert names(project["dependencies"]) == {"pyarrow", "protobuf"}
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs]
    assert names(extras) == CLIENT_EXTRAS


#: A module past this many lines says at its top why it is one module ("Its length:").
LONG_MODULE_LINES = 400


def test_a_long_module_says_why_it_is_one() -> None:
    unexplained = []
    for f in sorted(ROOT.rglob("*.py")):
        text = f.read_text(encoding="utf-8")
        if text.count("\n") <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "Its length:" not in doc and "Why one module" not in doc:
            unexplained.append(f"{f.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, "no reason at the top of: " + ", ".join(unexplained)


def test_no_assert_statement_in_the_server() -> None:
    """``python -O`` drops asserts: an invariant the gateway relies on is checked with a
    raise (``thalweg.errors.InvariantError``), which no optimisation removes."""
    found = [
        f"{f.relative_to(ROOT)}:{node.lineno}"
        for f in sorted(ROOT.rglob("*.py"))
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assert)
    ]
    assert not found, "assert statements: " + ", ".join(found)


def test_the_read_side_asks_the_catalog_not_its_parts() -> None:
    """``flight/`` reads the lanes through ``LaneCatalog``'s questions only: reaching
    into its layout, reader or live tail ties the serving code to how lanes are stored."""
    reach = re.compile(r"\bcatalog\.(layout|reader|live)\b")
    found = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in sorted((ROOT / "flight").rglob("*.py"))
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if reach.search(line)
    ]
    assert not found, "reaches into the catalog: " + ", ".join(found)
