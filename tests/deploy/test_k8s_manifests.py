"""deploy/k8s/: the manifests parse, and the fields the deployment depends on are there: a volume
per shard pod, gRPC health probes, a headless governing Service, the proxy's consistent hash over
exactly the shard names the ring files use, and an nginx config nginx itself accepts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.support import DEPLOY

K8S = DEPLOY / "k8s"


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return docs


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def _nginx_conf() -> str:
    return str(_one("ConfigMap", "sessions-proxy")["data"]["nginx.conf"])


def _upstream_servers(conf: str) -> list[str]:
    return re.findall(r"^\s*server (\S+) max_fails=0;$", conf, flags=re.MULTILINE)


def test_every_document_has_kind_and_name() -> None:
    docs = _documents()
    assert {d["kind"] for d in docs} >= {"StatefulSet", "Service", "ConfigMap", "Deployment"}
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"]


def test_statefulset_has_a_volume_per_pod_and_grpc_probes() -> None:
    sts = _one("StatefulSet", "sessions")
    spec = sts["spec"]
    assert spec["serviceName"] == "sessions"
    claims = spec["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    assert claims[0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    server = next(c for c in pod["containers"] if c["name"] == "sessions")
    assert {"name": "data", "mountPath": "/data"} in server["volumeMounts"]
    assert "--allow-plaintext" in server["args"] and "--listen=0.0.0.0:50051" in server["args"]
    assert "--ring-file=/ring/ring.json" in server["args"]
    assert "--probe-listen=0.0.0.0:50052" in server["args"]
    # nginx answers no ping while its client pauses a stream (test_proxy_nginx): as long as its send_timeout.
    assert "--keepalive-timeout-seconds=3600" in server["args"]
    assert {"name": "probes", "containerPort": 50052} in server["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"] == {"port": 50052}, probe
    # The pod template's own volumes must not shadow the per-pod claim.
    assert "data" not in {v["name"] for v in pod["volumes"]}
    # The replicator sidecar shares the same per-pod volume.
    replicator = next(c for c in pod["containers"] if c["name"] == "litestream")
    assert {"name": "data", "mountPath": "/data"} in replicator["volumeMounts"]
    # ... and finds the directory it watches made, on a new volume too (an audit saw Litestream
    # exit when it started before the server had made it).
    watched = yaml.safe_load(_one("ConfigMap", "sessions-ring")["data"]["litestream.yml"])["dbs"][0]["dir"]
    maker = next(c for c in pod["initContainers"] if c["name"] == "objects-dir")
    assert {"name": "data", "mountPath": "/data"} in maker["volumeMounts"]
    assert f"os.makedirs('{watched}', exist_ok=True)" in " ".join(maker["command"])


def test_headless_service_governs_the_statefulset() -> None:
    headless = _one("Service", "sessions")
    assert headless["spec"]["clusterIP"] == "None"
    labels = _one("StatefulSet", "sessions")["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= labels.items()


def test_proxy_hashes_over_exactly_the_ring_names() -> None:
    conf = _nginx_conf()
    assert "hash $http_x_object_key consistent;" in conf
    assert "grpc_pass grpc://sessions_shards;" in conf
    assert "grpc_next_upstream off;" in conf
    shards = json.loads(_one("ConfigMap", "sessions-ring")["data"]["shards.json"])
    assert _upstream_servers(conf) == shards, "nginx's ring and the shards' ring would differ"
    replicas = _one("StatefulSet", "sessions")["spec"]["replicas"]
    assert len(shards) == replicas
    for index in range(replicas):  # each upstream name is a per-pod Service with a stable address
        service = _one("Service", f"sessions-{index}")
        assert service["spec"]["selector"] == {"statefulset.kubernetes.io/pod-name": f"sessions-{index}"}
        assert shards[index] == f"sessions-{index}:{service['spec']['ports'][0]['port']}"
    deployment = _one("Deployment", "sessions-proxy")
    assert _one("Service", "sessions-proxy")["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_proxy_config_is_the_shipped_nginx_conf() -> None:
    """The ConfigMap's nginx.conf is deploy/nginx/nginx.conf except for container paths, port and
    shard names, so both are tested by the nginx e2e test."""

    def normalized(text: str) -> list[str]:
        skip = re.compile(r"^(pid|error_log|access_log|listen|server \S+ max_fails|\w+_temp_path)\b")
        lines = [line.strip() for line in text.splitlines()]
        return [line for line in lines if line and not line.startswith("#") and not skip.match(line)]

    shipped = (DEPLOY / "nginx" / "nginx.conf").read_text(encoding="utf-8")
    assert normalized(_nginx_conf()) == normalized(shipped)


def test_nginx_accepts_the_proxy_config(tmp_path: Path) -> None:
    conf = _nginx_conf()
    for index, name in enumerate(_upstream_servers(conf)):  # cluster DNS names are not resolvable here
        conf = conf.replace(f"server {name} ", f"server 127.0.0.1:{50051 + index} ")
    conf = conf.replace("/tmp/", f"{tmp_path}/")
    (tmp_path / "nginx.conf").write_text(conf, encoding="utf-8")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_pods_replicate_with_the_settings_the_docs_measured() -> None:
    """The pods' Litestream left out the checkpoint settings, busy-timeout and region of
    deploy/litestream/litestream.yml, with which the RPO in the docs was measured."""
    measured = yaml.safe_load((DEPLOY / "litestream" / "litestream.yml").read_text())["dbs"][0]
    pods = yaml.safe_load(_one("ConfigMap", "sessions-ring")["data"]["litestream.yml"])["dbs"][0]
    where = {"dir", "meta-dir", "replica"}
    assert {k: v for k, v in pods.items() if k not in where} == {k: v for k, v in measured.items() if k not in where}
    assert {k: v for k, v in pods["replica"].items() if k != "url"} == {
        k: v for k, v in measured["replica"].items() if k != "url"
    }
