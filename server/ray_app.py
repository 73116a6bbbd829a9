"""Voxwire as a Ray Serve deployment (docs/scale-out.md).

A replica is one Voxwire process: the app that ``voxwire serve`` runs (server/app.py),
built inside the replica by ``serve.ingress``, whose lifespan starts the inference worker.
Ray's proxy routes each WebSocket to a replica and counts it as one ongoing request for as
long as it is open, which is what the deployment's autoscaling reads.

Settings come as in ``voxwire serve``: VOXWIRE_* variables (a deployment's
``runtime_env``), a settings file named by VOXWIRE_CONFIG, and the application's
``settings`` argument in deploy/ray/serve.yaml, which outranks both. Host, port and
workers are Ray's business here and are ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.applications import Starlette

from server import config_loader
from server.app import create_app
from server.config import ServerConfig
from server.limits import WORKER_INDEX_ENV

# Defaults for deploy/ray/serve.yaml to override. One open socket is one ongoing request.
MAX_ONGOING_REQUESTS = 64
"""Sockets one replica holds: Limits.max_utterances_total (64), so a replica Ray sends a
socket to can always give it an utterance slot; docs/scale-out.md has the measurement."""
GRACEFUL_SHUTDOWN_TIMEOUT_S = 30.0
"""Longer than drain_seconds (10 s): in-flight utterances finish before Ray stops the replica."""


def replica_config(settings: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> ServerConfig:
    """The server's configuration in a replica: the environment's VOXWIRE_* variables and
    settings file, then ``settings`` by key (``engine``, ``cache_mb``, ``voices_dir``...).
    A bad setting raises ``SettingsError`` with the same words as ``voxwire serve``."""
    merged = dict(os.environ if env is None else env)
    known = {s.key: s for s in config_loader.settings()}
    for key, value in (settings or {}).items():
        if key not in known:
            raise config_loader.SettingsError(f"unknown setting {key!r} in the deployment's settings")
        s = known[key]
        merged[s.env] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return config_loader.load(None, merged)


@serve.deployment(max_ongoing_requests=MAX_ONGOING_REQUESTS, graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_TIMEOUT_S)
@serve.ingress()
class Voxwire:
    """One replica. Ray calls ``__serve_build_asgi_app__`` in the replica after the
    constructor, and runs the returned app's lifespan (the worker starts there)."""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self._config = replica_config(settings)
        # Metrics are labelled by worker: here, by replica, so two replicas' series differ.
        os.environ[WORKER_INDEX_ENV] = serve.get_replica_context().replica_id.unique_id
        self._app: Starlette | None = None

    def __serve_build_asgi_app__(self) -> Starlette:
        self._app = create_app(self._config)
        return self._app

    async def probe(self) -> dict[str, Any]:
        """This replica's state, for a deployment handle (operators' scripts and the tests
        read it; HTTP requests through the proxy reach a replica of Ray's choosing)."""
        service = self._app.state.service if self._app is not None else None
        if service is None:
            return {"replica": serve.get_replica_context().replica_id.unique_id, "pid": os.getpid()}
        worker = service.worker
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "pid": os.getpid(),
            "rss_bytes": _rss_bytes(),
            "connections": service.admission.connections,
            "utterances": [
                {"steps": u.steps, "produced_samples": u.produced_samples, "queued_samples": u.queue.samples,
                 "ahead_samples": u.queue.ahead, "backlogged": u.backlogged()}
                for u in worker.utterances()
            ],
            "engine_rate": worker.engine.sample_rate if worker.engine else None,
            "steps": worker.stats.steps,
            "generators_closed": worker.stats.generators_closed,
            "draining": service.draining,
        }

    async def check_health(self) -> None:
        """Ray restarts a replica whose check fails: one whose worker is gone for good
        (the supervisor replaces a hung one on its own, so this only sees what it cannot)."""
        if self._app is None:
            return
        service = self._app.state.service
        if service.defaults is not None and not service.supervisor.worker.alive and not service.draining:
            raise RuntimeError("the inference worker is not running")


def build(args: dict[str, Any]) -> Application:
    """The application builder that deploy/ray/serve.yaml names: ``args`` may hold
    ``settings`` (Voxwire's, by key). Deployment options (replicas, autoscaling,
    resources) are the config file's ``deployments`` section."""
    settings = args.get("settings") or {}
    replica_config(settings)  # fail here, in ``serve run``, rather than in every replica
    return Voxwire.bind(settings)


def _rss_bytes() -> int:
    """This process's resident memory (Linux), for the stalled-reader bound."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
