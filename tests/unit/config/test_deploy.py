"""The deployment files agree with the gateway: the kustomize base's kinds and wiring
(headless Service, per-pod advertised address, probes on the admin server's paths,
ports equal to the configuration's listeners, a disruption budget over the pods,
resources, a grace period longer than the drain), its configuration validates with the
pod's environment, and the image installs every extra the gateway can use."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from thalweg.config import load_config
from thalweg.errors import ConfigError

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
BASE = DEPLOY / "kubernetes" / "base"
ADMIN_PATHS = {"/live", "/ready", "/health", "/metrics", "/stats"}


def manifests() -> dict[str, list[dict[str, Any]]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    out: dict[str, list[dict[str, Any]]] = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            out.setdefault(doc["kind"], []).append(doc)
    return out


def config(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("POD_NAME", "thalweg-2")
    monkeypatch.setenv("KAFKA_PASSWORD", "s3cret")
    return load_config(BASE / "thalweg.toml")


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_base_has_the_kinds_a_scale_out_needs() -> None:
    kinds = manifests()
    assert set(kinds) == {"StatefulSet", "Service", "PodDisruptionBudget"}
    (sts,) = kinds["StatefulSet"]
    headless = [s for s in kinds["Service"] if s["spec"].get("clusterIP") == "None"]
    assert [s["metadata"]["name"] for s in headless] == [sts["spec"]["serviceName"]]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for svc in kinds["Service"]:
        assert svc["spec"]["selector"].items() <= labels.items()
    (pdb,) = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (generated,) = kustomization["configMapGenerator"]
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": generated["name"]}} in volumes
    assert generated["files"] == ["thalweg.toml"]


def test_ports_probes_and_the_drain_match_the_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = config(monkeypatch)
    (sts,) = manifests()["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "flight": port(cfg.gateway.flight_listen),
        "admin": port(cfg.gateway.http_listen),
    }
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in ADMIN_PATHS and get["port"] == "admin"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/live"
    assert pod["terminationGracePeriodSeconds"] > cfg.gateway.shutdown_timeout_s
    assert container["resources"]["requests"] and container["resources"]["limits"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert Path(mounts["lane"]) == cfg.gateway.data_dir
    assert container["args"][-1] == f"{mounts['config']}/thalweg.toml"
    # Each pod advertises itself through the headless Service.
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert cfg.gateway.flight_advertise == f"grpc://thalweg-2.{sts['spec']['serviceName']}:8815"
    # Every ${NAME} in the file's values is set by the pod.
    values = json.dumps(tomllib.loads((BASE / "thalweg.toml").read_text()))
    names = set(re.findall(r"\$\{(\w+)\}", values))
    assert names and names <= set(env)


def test_the_admin_server_answers_the_probe_paths() -> None:
    source = (Path(__file__).resolve().parents[3] / "server/thalweg/ops/http.py").read_text()
    for path in ("/live", "/ready"):
        assert f'path == "{path}"' in source


def test_an_unset_variable_is_an_error_naming_key_and_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KAFKA_PASSWORD", raising=False)
    monkeypatch.setenv("POD_NAME", "thalweg-0")
    with pytest.raises(
        ConfigError,
        match=r"sources\[0\]\.sasl_password: environment variable "
        r"KAFKA_PASSWORD is not set",
    ):
        load_config(BASE / "thalweg.toml")


def test_the_image_installs_every_extra_the_gateway_can_use() -> None:
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    # Not the gateway's: tests, tooling, readers' libraries, the embedded broker.
    runtime = set(project["optional-dependencies"]) - {
        "test",
        "dev",
        "mutation",
        "all",
        "clients",
        "spark",
        "embedded",
    }
    docker = (DEPLOY / "Dockerfile").read_text()
    installed = set(re.search(r'"\.\[([a-z0-9,]+)\]"', docker)[1].split(","))  # type: ignore[index]
    assert installed == runtime
    assert "USER 999" in docker and "fsGroup: 999" in (BASE / "statefulset.yaml").read_text()


OVERLAY = DEPLOY / "kubernetes" / "overlays" / "object-store"


def json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The two RFC 6902 operations the overlay uses (remove; add, with ``-`` to append)."""
    for op in ops:
        *parents, last = [p for p in op["path"].split("/") if p]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "remove":
            del node[last]
        elif last == "-":
            node.append(op["value"])
        else:
            node[last] = op["value"]
    return doc


def test_the_object_store_overlay_keeps_the_lane_in_the_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../../base"]
    base = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (generated,) = kustomization["configMapGenerator"]
    assert generated["behavior"] == "replace"
    assert generated["name"] == base["configMapGenerator"][0]["name"]
    monkeypatch.setenv("POD_NAME", "thalweg-1")
    monkeypatch.setenv("KAFKA_PASSWORD", "s3cret")
    cfg = load_config(OVERLAY / generated["files"][0])
    assert cfg.gateway.lanes_in_object_store
    assert cfg.compaction.enabled  # merged objects in the bucket, parts removed

    (patch,) = kustomization["patches"]
    (sts,) = manifests()["StatefulSet"]
    assert patch["target"] == {"kind": "StatefulSet", "name": sts["metadata"]["name"]}
    sts = json_patch(sts, yaml.safe_load(patch["patch"]))
    assert "volumeClaimTemplates" not in sts["spec"]
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["lane"]  # only a cache: the bucket is the lane
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert Path(mounts["lane"]) == cfg.gateway.object_store.cache_dir == cfg.gateway.data_dir
    assert container["envFrom"] == [{"secretRef": {"name": "thalweg-s3"}}]
