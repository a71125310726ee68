"""docs/deploy/raycluster.yaml, validated offline: the Kubernetes objects and every pod
template of the RayCluster against Kubernetes' own schemas (kubernetes-validate, strict:
an unknown field fails), and the RayCluster's KubeRay fields forkpoint relies on. KubeRay's
CRD schema is not in the package registry: its own fields are checked by name here, and
nothing was applied to a live cluster (docs/deploy/kubernetes.md says so)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

MANIFEST = Path(__file__).resolve().parent.parent / "docs" / "deploy" / "raycluster.yaml"


def _documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _validate(document: dict[str, Any]) -> None:
    """Kubernetes' schema for ``document``; a RayCluster's pod templates as PodTemplates."""
    version = kubernetes_validate.latest_version()
    if document["kind"] != "RayCluster":
        kubernetes_validate.validate(document, version, strict=True)
        return
    spec = document["spec"]
    groups = [("head", spec["headGroupSpec"])] + [
        (g["groupName"], g) for g in spec["workerGroupSpecs"]
    ]
    for name, group in groups:
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
                    "template": group["template"]}  # fmt: skip
        kubernetes_validate.validate(template, version, strict=True)


def test_the_manifest_is_valid_kubernetes() -> None:
    documents = _documents()
    assert {d["kind"] for d in documents} == {"Namespace", "Secret", "RayCluster"}
    for document in documents:
        _validate(document)


def test_the_ray_cluster_is_what_forkpoint_needs() -> None:
    (cluster,) = [d for d in _documents() if d["kind"] == "RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    assert spec["rayVersion"].startswith("2.60")  # the series forkpoint[cluster] pins
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no VM on the head
    assert "redisAddress" in spec["gcsFaultToleranceOptions"]
    (workers,) = spec["workerGroupSpecs"]
    assert "forkpoint_vm" in workers["rayStartParams"]["resources"]
    labels = workers["rayStartParams"]["labels"]
    assert "forkpoint.dev/node=" in labels and "forkpoint.dev/qemu=" in labels
    pod = workers["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_kill_child_processes_on_worker_exit"]["value"] == "0"
    assert {"RAY_AUTH_TOKEN", "FORKPOINT_HOME", "FORKPOINT_CLUSTER_STORE"} <= set(env)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kvm"]["hostPath"]["path"] == "/dev/kvm"
    assert volumes["home"]["hostPath"]["path"] == env["FORKPOINT_HOME"]["value"]
    head_env = {
        e["name"] for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} <= head_env


def test_the_validator_rejects_what_kubernetes_would() -> None:
    """A misspelt field in a worker's container fails: the check above can fail."""
    (cluster,) = [d for d in _documents() if d["kind"] == "RayCluster"]
    broken = copy.deepcopy(cluster)
    broken["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(broken)
