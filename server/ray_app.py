"""Voxwire as a Ray Serve deployment (docs/scale-out.md).

A replica is one Voxwire process: the app that ``voxwire serve`` runs (server/app.py),
built inside the replica by ``serve.ingress``, whose lifespan starts the inference worker.
Ray's proxy routes each WebSocket to a replica and counts it as one ongoing request for as
long as it is open, which is what the deployment's autoscaling reads.

Settings come as in ``voxwire serve``: VOXWIRE_* variables (a deployment's
``runtime_env``), a settings file named by VOXWIRE_CONFIG, and the application's
``settings`` argument in deploy/ray/serve.yaml, which outranks both. Host, port and
workers are Ray's business here and are ignored.

Two things ``voxwire serve`` does by itself need help under Ray: the drain when the
process is told to stop (Ray stops a replica through its actor, not a signal this code
can catch), and one scrape per process (Ray's proxy sends ``/metrics`` to a replica of
its choosing). Both are here.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from ray import serve
from ray.serve import Application
from starlette.applications import Starlette

from voxwire.server import config_loader
from voxwire.server.app import create_app
from voxwire.server.config import ServerConfig
from voxwire.server.limits import WORKER_INDEX_ENV, worker_index
from voxwire.server.logs import configure_logging, process_fields
from voxwire.server.metrics import Metrics
from voxwire.server.service import Service

log = logging.getLogger(__name__)

# Defaults for deploy/ray/serve.yaml to override. One open socket is one ongoing request.
MAX_ONGOING_REQUESTS = 64
"""Sockets one replica holds: Limits.max_utterances_total (64), so a replica Ray sends a
socket to can always give it an utterance slot; docs/scale-out.md has the measurement."""
GRACEFUL_SHUTDOWN_TIMEOUT_S = 30.0
"""Longer than drain_seconds (10 s): in-flight utterances finish before Ray stops the replica."""
STOP_POLL_S = 0.2
"""How often a replica looks whether Ray has begun to stop it: a fraction of any drain."""
METRICS_PORTS_PER_NODE = 16
"""Replicas on one node take consecutive ports from ``metrics_port`` up: this many at most."""
SCRAPE_REFRESH_TIMEOUT_S = 5.0


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
    constructor, and runs the returned app's lifespan (the worker starts there).

    ``metrics_port``: None, no exporter of its own; 0, any free port; N, the first free
    port of N .. N+15 (several replicas on one node). ``probe()`` says which it took."""

    def __init__(self, settings: Mapping[str, Any] | None = None, metrics_port: int | None = None) -> None:
        self._config = replica_config(settings)
        context = serve.get_replica_context()
        # Ray's own Serve metrics carry these labels, so the two join on them.
        self._labels = {"application": context.app_name, "deployment": context.deployment,
                        "replica": context.replica_id.unique_id}
        # A replica is numbered as a ``--workers`` process is (server/processes.py): its index
        # names it in log lines and is its metrics' ``worker`` label; the replica id is the
        # ``replica`` label above. Set before the app is built: the service reads it then.
        index = replica_index(context)
        if index is not None:
            os.environ[WORKER_INDEX_ENV] = str(index)
        # As ``voxwire serve`` and each ``--workers`` process do, before the first line:
        # Ray configures only its own loggers, so without this Voxwire's lines (and
        # uvicorn's, where a replica serves HTTP itself) reach Ray's logs through Python's
        # last-resort handler, unformatted and with no credential redacted.
        configure_logging(self._config.log_level, self._config.log_format)
        if index is None:
            log.warning("Ray gives replica %s no rank: its log lines and metrics carry no worker index of "
                        "their own", context.replica_id.unique_id)
        self._metrics_port = metrics_port
        self._exporter: MetricsExporter | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._app: Starlette | None = None

    async def __serve_build_asgi_app__(self) -> Starlette:
        # Ray awaits this on the loop that serves the app's requests: the drain and the
        # exporter's refresh must run there, where the service's state lives.
        self._app = create_app(self._config)
        service: Service = self._app.state.service
        loop = asyncio.get_running_loop()
        stopping = ray_is_stopping_this_replica()
        if stopping is None:
            log.warning("this Ray gives no sign when it stops a replica: open sockets will be cut, not drained "
                        "(docs/scale-out.md)")
        else:
            self._drainer = loop.create_task(drain_when(stopping, service), name="drain-when-ray-stops")
        if self._metrics_port is not None:
            self._exporter = MetricsExporter(service.metrics, self._labels, self._metrics_port, loop)
            log.info("replica %s serves its metrics at :%d/metrics", self._labels["replica"], self._exporter.port)
        return self._app

    async def __del__(self) -> None:
        # Ray calls this once the replica's requests have ended (after the drain), just
        # after the app's lifespan has shut the service down.
        if self._drainer is not None:
            self._drainer.cancel()
        if self._exporter is not None:
            await asyncio.to_thread(self._exporter.close)  # waits out its serve loop's poll

    async def probe(self) -> dict[str, Any]:
        """This replica's state, for a deployment handle (operators' scripts and the tests
        read it; HTTP requests through the proxy reach a replica of Ray's choosing)."""
        service = self._app.state.service if self._app is not None else None
        # "worker": its index as its limits read it (server/limits.py); "log_fields": what its
        # Voxwire log lines say of it (server/logs.py).
        here = {"replica": self._labels["replica"], "pid": os.getpid(), "worker": worker_index(),
                "log_fields": process_fields(),
                "metrics_port": self._exporter.port if self._exporter is not None else None}
        if service is None:
            return here
        worker = service.worker
        return here | {
            "rss_bytes": _rss_bytes(),
            "connections": service.admission.connections,
            "utterances": [
                {"steps": u.steps, "produced_samples": u.produced_samples, "queued_samples": u.queue.samples,
                 "ahead_samples": u.queue.ahead, "backlogged": u.backlogged()}
                for u in worker.utterances()
            ],
            "engine_rate": worker.engine.sample_rate if worker.engine else None,
            "steps": worker.stats.steps,
            "streams_closed": worker.stats.streams_closed,
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


def replica_index(context: Any) -> int | None:
    """A replica's worker index: Ray's rank of it in its deployment, 0 .. N-1 as
    ``--workers N`` numbers its processes (a replacement takes the smallest rank free, as a
    restarted worker keeps its index). Read once, when the replica starts: if Ray renumbers
    its replicas later (after a downscale), this one's lines and series keep the index they
    began with. None where this Ray gives none (one from before replica ranks)."""
    rank = getattr(context, "rank", None)
    rank = getattr(rank, "rank", rank)  # a ReplicaRank (Ray 2.60), or the int itself
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def build(args: dict[str, Any]) -> Application:
    """The application builder that deploy/ray/serve.yaml names: ``args`` may hold
    ``settings`` (Voxwire's, by key) and ``metrics_port`` (each replica's own scrape
    port, see ``Voxwire``). Deployment options (replicas, autoscaling, resources) are
    the config file's ``deployments`` section."""
    settings = args.get("settings") or {}
    replica_config(settings)  # fail here, in ``serve run``, rather than in every replica
    port = args.get("metrics_port")
    if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535 - METRICS_PORTS_PER_NODE):
        raise config_loader.SettingsError(f"metrics_port must be a port number (0: any free port), not {port!r}")
    # serve.deployment made the class a Deployment; serve.ingress's annotations hide that.
    return cast(serve.Deployment, Voxwire).bind(settings, metrics_port=port)


def ray_is_stopping_this_replica() -> Callable[[], bool] | None:
    """True from the moment Ray begins a graceful stop of this replica (downscaling, a
    redeploy, ``serve delete``/``shutdown``), or None if this Ray shows no such sign.

    Ray 2.60 calls no user code when the stop begins: it stops routing to the replica,
    waits for its ongoing requests to end (every open socket is one), and only then runs
    the app's lifespan shutdown and ``__del__``. The one sign is the flag its replica sets
    first (``_shutting_down``, ray/serve/_private/replica.py, ``_perform_graceful_shutdown``;
    its comment offers it to subclasses), read here from the replica's actor instance."""
    try:
        from ray._private.worker import global_worker

        actor = global_worker.actors.get(global_worker.actor_id)
    except Exception:  # not in an actor (local testing mode), or a Ray laid out otherwise
        return None
    replica = getattr(actor, "_replica_impl", None)
    if replica is None or not isinstance(getattr(replica, "_shutting_down", None), bool):
        return None
    return lambda: bool(replica._shutting_down)


async def drain_when(stopping: Callable[[], bool], service: Service) -> None:
    """Voxwire's SIGTERM drain (docs/reliability.md) once ``stopping()``: no new work,
    in-flight utterances finish within drain_seconds, then every socket closes with 1001.
    The closed sockets end Ray's wait for the replica's requests."""
    while not stopping():
        await asyncio.sleep(STOP_POLL_S)
    log.info("Ray is stopping this replica: draining for up to %.0f s", service.config.drain_seconds)
    await service.drain(service.config.drain_seconds)


class ReplicaMetrics(Collector):
    """One replica's Voxwire metrics, each sample labelled with the replica's
    ``application``, ``deployment`` and ``replica``, as Ray labels its Serve metrics."""

    def __init__(self, metrics: Metrics, labels: Mapping[str, str], loop: asyncio.AbstractEventLoop) -> None:
        self._metrics = metrics
        self._labels = dict(labels)
        self._loop = loop

    def collect(self) -> Iterable[Metric]:
        # The gauges read the service's state, which belongs to the replica's loop: refresh
        # them there (this runs on the exporter's thread), so a scrape is current.
        asyncio.run_coroutine_threadsafe(_refresh(self._metrics), self._loop).result(SCRAPE_REFRESH_TIMEOUT_S)
        for family in self._metrics.registry.collect():
            labelled = copy.copy(family)
            labelled.samples = [s._replace(labels={**s.labels, **self._labels}) for s in family.samples]
            yield labelled


class MetricsExporter:
    """A replica's own ``/metrics`` on its own port, for Prometheus to scrape each replica."""

    def __init__(self, metrics: Metrics, labels: Mapping[str, str], first_port: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ReplicaMetrics(metrics, labels, loop))
        ports = [0] if first_port == 0 else range(first_port, first_port + METRICS_PORTS_PER_NODE)
        for port in ports:
            try:
                self._server, _ = start_http_server(port, registry=registry)
                break
            except OSError:
                continue  # another replica (or process) on this node has it
        else:
            raise RuntimeError(f"no free port for this replica's metrics in {ports[0]}..{ports[-1]}")
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


async def _refresh(metrics: Metrics) -> None:
    metrics.refresh()


def _rss_bytes() -> int:
    """This process's resident memory (Linux), for the stalled-reader bound."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
