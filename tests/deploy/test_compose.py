"""deploy/compose.yaml, checked statically against deploy/Dockerfile and deploy/nginx.conf.

There is no Compose engine (nor Docker) on the test machine, so nothing here starts a
container: the file is read as YAML and each thing that ties it to the image, to nginx's
site config or to the server's settings is compared with its source, parsed from that
source rather than copied here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from voxwire.server.config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NGINX_SITE = "/etc/nginx/conf.d/default.conf"


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def service(name: str) -> dict[str, Any]:
    services = compose()["services"]
    assert name in services, f"compose.yaml has no `{name}` service"
    return services[name]


def interpolate(value: str) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR-default}, each as if VAR were unset."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def mounts(svc: dict[str, Any]) -> list[dict[str, Any]]:
    """A service's volumes as {type, source, target}, from the short or the long syntax."""
    out = []
    for volume in svc.get("volumes", []):
        if isinstance(volume, dict):
            out.append({"type": volume["type"], "source": volume.get("source"), "target": volume["target"]})
            continue
        source, target, *_ = interpolate(volume).split(":")
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        out.append({"type": kind, "source": source, "target": target})
    return out


def dockerfile_image() -> dict[str, list[str]]:
    """The final image's instructions from deploy/Dockerfile (its stage and the stages it
    is built FROM), as {INSTRUCTION: [arguments, ...]} with continuation lines joined."""
    logical, pending = [], ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            logical.append(pending + line.strip())
            pending = ""
    stages: dict[str, list[tuple[str, str]]] = {}
    order = []
    for instruction in logical:
        keyword, _, args = instruction.partition(" ")
        if keyword.upper() == "FROM":
            base, *alias = args.split()
            name = alias[-1] if alias else f"#{len(order)}"
            order.append(name)
            stages[name] = [("FROM", base)]
        elif order:
            stages[order[-1]].append((keyword.upper(), args.strip()))
    chain, name = [], order[-1]
    while name in stages:
        chain.insert(0, name)
        name = stages[name][0][1]
    image: dict[str, list[str]] = {}
    for stage in chain:
        for keyword, args in stages[stage][1:]:
            image.setdefault(keyword, []).append(args)
    return image


def image_env() -> dict[str, str]:
    env = {}
    for args in dockerfile_image().get("ENV", []):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def effective_env() -> dict[str, str]:
    """The server's environment in the container: the image's ENV, then compose's."""
    env = image_env()
    given = service("voxwire").get("environment") or {}
    if isinstance(given, list):
        given = dict(item.partition("=")[::2] for item in given)
    env.update({k: str(v) for k, v in given.items() if v is not None})
    return env


def nginx_directives(name: str, block: str = "") -> list[str]:
    """The arguments of every uncommented `name ...;` directive in deploy/nginx.conf, or in
    its blocks that open with `block` (e.g. "upstream")."""
    text = "\n".join(line.split("#", 1)[0] for line in (DEPLOY / "nginx.conf").read_text().splitlines())
    if block:  # nginx.conf's upstream blocks hold no nested block
        text = "\n".join(re.findall(rf"(?:^|[;{{}}\s]){block}\s[^{{;]*\{{([^{{}}]*)\}}", text))
    return [" ".join(args.split()) for args in re.findall(rf"(?:^|[;{{}}\s]){name}\s+([^;{{}}]+);", text)]


def port_of(address: str) -> int:
    """The port of an nginx listen or server address: `80`, `[::]:80`, `127.0.0.1:8000`."""
    return int(address.split()[0].rsplit(":", 1)[-1])


def duration_seconds(value: str) -> float:
    """Compose's duration format: 15s, 1m30s, 500ms, 1h."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"not a Compose duration: {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def test_it_is_a_compose_specification_file():
    assert "version" not in compose(), "the top-level `version:` is obsolete in the Compose Specification"
    assert set(compose()["services"]) == {"voxwire", "nginx"}


def test_the_build_is_deploy_dockerfile_from_the_repository_root():
    build = service("voxwire")["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT, (
        f"the build context {build['context']!r} is not the repository root (.dockerignore, pyproject.toml)"
    )
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile", (
        f"the build's dockerfile {build['dockerfile']!r}, relative to the context, is not deploy/Dockerfile"
    )


def test_the_volumes_are_the_images_volumes_and_their_sources_exist():
    (declared,) = dockerfile_image()["VOLUME"]
    image_volumes = set(yaml.safe_load(declared)) if declared.startswith("[") else set(declared.split())
    voxwire = mounts(service("voxwire"))
    targets = [m["target"] for m in voxwire]
    assert sorted(targets) == sorted(image_volumes), (
        f"the voxwire service mounts {targets}, but deploy/Dockerfile declares VOLUME {sorted(image_volumes)}: "
        "an undeclared path is read-only in the container, and a declared one left out gets an anonymous volume"
    )
    named = compose().get("volumes") or {}
    for svc in ("voxwire", "nginx"):
        for mount in mounts(service(svc)):
            if mount["type"] == "bind" and not mount["source"].startswith(("/", "~")):
                source = DEPLOY / mount["source"]
                assert source.exists(), f"{svc} bind-mounts {mount['source']} ({source}), which does not exist"
            elif mount["type"] == "volume":
                assert mount["source"] in named, f"{svc} mounts volume {mount['source']!r}, not declared under volumes:"


def test_nginx_runs_deploy_nginx_conf_as_its_only_site():
    site = [m for m in mounts(service("nginx")) if m["target"] == NGINX_SITE]
    assert site, f"nginx mounts nothing at {NGINX_SITE}: it would serve the image's default page"
    (mount,) = site
    assert (DEPLOY / mount["source"]).resolve() == DEPLOY / "nginx.conf", (
        f"nginx's {NGINX_SITE} is {mount['source']}, not deploy/nginx.conf"
    )


def test_nginxs_upstream_reaches_the_server_in_its_network_namespace():
    assert service("nginx").get("network_mode") == "service:voxwire", (
        "nginx must share the voxwire service's network namespace: its upstream is 127.0.0.1"
    )
    env = effective_env()
    upstreams = nginx_directives("server", block="upstream")
    assert upstreams, "deploy/nginx.conf's upstream lists no server"
    for address in upstreams:
        host = address.split()[0].rsplit(":", 1)[0]
        assert host == "127.0.0.1", f"nginx.conf's upstream server {address!r} is not on the shared loopback"
        assert port_of(address) == int(env["VOXWIRE_PORT"]), (
            f"nginx.conf's upstream server {address!r} is not the server's port, VOXWIRE_PORT={env['VOXWIRE_PORT']}"
        )
    assert env["VOXWIRE_HOST"] in ("127.0.0.1", "0.0.0.0"), (
        f"the server listens on VOXWIRE_HOST={env['VOXWIRE_HOST']}, which nginx's 127.0.0.1 does not reach"
    )


def test_the_published_port_is_the_one_nginx_listens_on():
    listens = {port_of(address) for address in nginx_directives("listen")}
    assert listens, "deploy/nginx.conf has no listen directive"
    assert "ports" not in service("nginx"), "a service in another's network namespace cannot publish ports"
    ports = service("voxwire")["ports"]
    assert ports, "no port is published: nginx would be unreachable from the host"
    for published in ports:
        container = int(str(published).split("/")[0].rsplit(":", 1)[-1])
        assert container in listens, (
            f"port {published!r} reaches container port {container}; nginx listens on {sorted(listens)}"
        )
    if any(address.startswith("[") for address in nginx_directives("listen")):
        sysctls = service("voxwire").get("sysctls") or {}
        if isinstance(sysctls, list):
            sysctls = dict(item.split("=", 1) for item in sysctls)
        assert str(sysctls.get("net.ipv6.conf.all.disable_ipv6")) == "0", (
            "nginx.conf listens on an IPv6 address: without IPv6 turned on in the namespace nginx does not start"
        )


def test_the_stop_grace_period_outlasts_the_drain():
    env = effective_env()
    drain = float(env.get("VOXWIRE_DRAIN_SECONDS", ServerConfig().drain_seconds))
    grace = duration_seconds(str(service("voxwire").get("stop_grace_period", "10s")))
    assert grace > drain, (
        f"stop_grace_period is {grace:g} s, not longer than the server's drain of {drain:g} s: "
        "Docker would SIGKILL it with utterances still in progress"
    )


def test_the_root_filesystem_is_read_only_with_a_tmpfs():
    voxwire = service("voxwire")
    assert voxwire.get("read_only") is True, "the voxwire service should run with a read-only root filesystem"
    tmpfs = voxwire.get("tmpfs") or []
    tmpfs = [tmpfs] if isinstance(tmpfs, str) else tmpfs
    assert "/tmp" in [t.split(":")[0] for t in tmpfs], (
        "a read-only root needs a tmpfs on /tmp (the image's HOME and working directory)"
    )


def test_nginx_waits_for_the_images_health_check():
    assert service("nginx").get("depends_on", {}).get("voxwire", {}).get("condition") == "service_healthy", (
        "nginx should start once the voxwire service is healthy (engine loaded), else it answers 502"
    )
    checks = dockerfile_image().get("HEALTHCHECK", [])
    assert checks and checks[-1].split()[0].upper() != "NONE", (
        "deploy/Dockerfile has no HEALTHCHECK: service_healthy would never be reached"
    )
    assert "healthcheck" not in service("voxwire"), "the image's HEALTHCHECK (on /readyz) is the one to wait for"
