"""deploy/k8s/rayservice.yaml and deploy/ray/*.yaml, checked statically (no cluster here).

kubernetes-validate knows Kubernetes' own kinds, not KubeRay's: the standard objects are
validated whole, the RayService's pod templates as PodTemplates, and its Serve config by
Ray Serve's own schema, the one `serve deploy` applies.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

pytest.importorskip("ray", reason="the ray extra (make test installs it)")
from ray.serve.schema import ServeDeploySchema  # noqa: E402

from voxwire.server.ray_app import replica_config  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = kubernetes_validate.latest_version()


def rayservice() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "rayservice.yaml").read_text()) if d]
    (service,) = [d for d in docs if d["kind"] == "RayService"]
    return [d for d in docs if d is not service], service


def pod_templates(service: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = service["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


def as_pod_template(template: dict[str, Any], name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def serve_configs() -> dict[str, dict[str, Any]]:
    _, service = rayservice()
    configs = {"rayservice.yaml": yaml.safe_load(service["spec"]["serveConfigV2"])}
    for path in sorted((DEPLOY / "ray").glob("*.yaml")):
        configs[path.name] = yaml.safe_load(path.read_text())
    return configs


def test_the_standard_objects_and_the_pod_templates_are_valid_kubernetes():
    others, service = rayservice()
    assert service["apiVersion"] == "ray.io/v1"
    for doc in others:
        kubernetes_validate.validate(doc, K8S, strict=True)
    templates = pod_templates(service)
    assert len(templates) == 3  # head, CPU workers, GPU workers
    for i, template in enumerate(templates):
        kubernetes_validate.validate(as_pod_template(template, f"t{i}"), K8S, strict=True)


def test_the_validator_does_catch_a_broken_template():
    _, service = rayservice()
    template = pod_templates(service)[1]
    broken = {**template, "spec": {**template["spec"], "terminationGracePeriodSeconds": "sixty"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_pod_template(broken, "broken"), K8S, strict=True)


@pytest.mark.parametrize("name", sorted(serve_configs()))
def test_each_serve_config_is_valid_and_its_voxwire_settings_load(name):
    config = serve_configs()[name]
    ServeDeploySchema.model_validate(config)
    # A request timeout would cut long sockets.
    assert config["http_options"].get("request_timeout_s") is None
    for app in config["applications"]:
        assert app["import_path"] == "voxwire.server.ray_app:build"
        settings = replica_config(app["args"]["settings"], env={})
        (deployment,) = app["deployments"]
        assert deployment["graceful_shutdown_timeout_s"] > settings.drain_seconds
        assert deployment["autoscaling_config"]["target_ongoing_requests"] <= deployment["max_ongoing_requests"]


def test_pods_outlive_the_replicas_drain():
    _, service = rayservice()
    longest = max(
        d["graceful_shutdown_timeout_s"]
        for app in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
        for d in app["deployments"]
    )
    for template in pod_templates(service)[1:]:
        assert template["spec"]["terminationGracePeriodSeconds"] > longest


def ray_dockerfile() -> tuple[str, str]:
    """deploy/ray/Dockerfile's tag (from its header's build command) and its FROM line's Ray."""
    text = (DEPLOY / "ray" / "Dockerfile").read_text()
    comments = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    (build,) = [line for line in comments if line.startswith("docker build ")]
    args = shlex.split(build)
    assert args[args.index("-f") + 1] == "deploy/ray/Dockerfile", f"the header builds another file: {build}"
    tag = args[args.index("-t") + 1]
    (base,) = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)(-\S*)?", base)
    assert match, f"deploy/ray/Dockerfile is not built on a released Ray image: FROM {base}"
    return tag, match.group(1)


def test_the_pods_run_deploy_ray_dockerfiles_image_with_the_manifests_ray():
    tag, ray_version = ray_dockerfile()
    _, service = rayservice()
    containers = [c for t in pod_templates(service) for c in t["spec"]["containers"]]
    assert containers, "the RayService has no containers"
    for container in containers:
        assert container["image"] == tag, (
            f"container {container['name']} runs {container['image']}, not the image "
            f"deploy/ray/Dockerfile's header builds ({tag})"
        )
    assert service["spec"]["rayClusterConfig"]["rayVersion"] == ray_version, (
        f"the manifest's rayVersion ({service['spec']['rayClusterConfig']['rayVersion']}) is not "
        f"the Ray of deploy/ray/Dockerfile's base image ({ray_version}): KubeRay expects the image's Ray"
    )
