"""Where the controller listens and who may talk to it: the gRPC ports (TLS,
mutual TLS for agents, one controller per port and per store), bearer tokens, the
Prometheus endpoint; and what SIGHUP reloads (the tokens and the queues)."""

from __future__ import annotations

import collections

import grpc
import structlog

from sia_grpc.api import node_state_name, pb, state_name
from sia_grpc.controller.config import ConfigError, read_config_queues, read_queues_file
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.shell.base import ShellBase
from sia_grpc.controller.shell.exclusive import StoreLock, check_bindable
from sia_grpc.controller.stores import is_postgres
from sia_grpc.observability import PREEMPTION_REASONS, RENEW_FAILURES, MetricsServer
from sia_grpc.policy.queues import QueueSet, changes, scheduled_in
from sia_grpc.security import auth
from sia_grpc.security.tls import ReloadingCertificates, is_loopback, read_pem
from sia_grpc.security.tokens import TokenError, TokenStore

log = structlog.get_logger("sia.controller")
# The state names the sia_jobs / sia_nodes gauges always report (the CLI's names).
_JOB_STATES = tuple(state_name(v) for v in pb.JobState.values() if v)
_NODE_STATES = tuple(node_state_name(v) for v in pb.NodeState.values() if v)


class Listeners(ShellBase):
    """A part of `Controller`: listening, security and metrics (the module docstring)."""

    def _observe(self) -> None:
        """The gauges' callables. They run on the metric reader's thread (a scrape, an
        OTLP export), so each reads a snapshot (the state's views copy what they scan)."""
        assert self.telemetry is not None  # (`_serve_metrics` calls this only with one)
        # `self.state` at each read, not now: a leader that steps down drops its state.
        self.telemetry.observe(
            queue_length=lambda: self.state.jobs_by_state().get("QUEUED", 0),
            queue_max_wait=lambda: self.state.queue_max_wait(self.clock.time()),
            events_pending=lambda: self._events.qsize(),
            # Every state, 0 included: a series that vanished would hide from alerts.
            jobs_by_state=lambda: dict.fromkeys(_JOB_STATES, 0) | self.state.jobs_by_state(),
            nodes_by_state=lambda: dict.fromkeys(_NODE_STATES, 0) | self.state.nodes_by_state(),
            nodes_by_isolation=lambda: self.state.nodes_by_isolation(),
            gpus_allocated=lambda: self.state.gpus_allocated(),
            gpus_capacity=lambda: self.state.gpus_capacity(),
            agents_connected=lambda: len(self._agents),
            solve_timeout=lambda: self.config.solve_timeout,
            queue_gpus_held=lambda: self.state.queue_metrics()["held"],
            queue_gpus_guarantee=lambda: self.state.queue_metrics()["guarantee"],
            queue_gpus_borrowed=lambda: self.state.queue_metrics()["borrowed"],
            queue_jobs_pending=lambda: self.state.queue_metrics()["pending"],
            leader=lambda: int(self.leading))
        for reason in RENEW_FAILURES:  # the series exist before the first failure
            self.telemetry.count_renew_failure(reason, zero=True)

    def _serve_metrics(self) -> None:
        """Register the gauges and, with metrics_listen, bind and serve /metrics."""
        if self.telemetry is None:
            return
        self._observe()
        address = self.config.metrics_listen
        if not address:
            return
        registry = getattr(self.telemetry, "prometheus_registry", None)
        if registry is None:
            raise ConfigError("metrics_listen: the controller's telemetry has no Prometheus "
                              "reader; make it with setup_telemetry(prometheus=True)")
        try:
            self._metrics = MetricsServer(registry, address)
        except OSError as err:
            raise OSError(f"metrics_listen: cannot bind {address}: {err}") from None
        self.metrics_port = self._metrics.port
        log.info("serving Prometheus metrics over plain HTTP, unauthenticated",
                 metrics_listen=address, metrics_port=self.metrics_port)

    def _security(self) -> auth.AuthInterceptor:
        """Load the tokens, say how the controller is exposed, build the interceptor."""
        cfg = self.config
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            try:
                read_pem(getattr(cfg, name), name)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        if cfg.tokens_file:
            try:
                self.tokens = TokenStore(cfg.tokens_file)
            except TokenError as err:
                raise ConfigError(f"tokens_file: {err}") from None
            log.info("clients authenticate with bearer tokens", tokens_file=cfg.tokens_file,
                     tokens=len(self.tokens))
        else:
            log.warning("no tokens_file: every caller is an anonymous admin "
                        "(development mode; see docs/security.md)")
        exposed = not all(is_loopback(a) for a in (cfg.listen, cfg.agent_address) if a)
        if not cfg.tls and exposed:
            log.warning("INSECURE: serving WITHOUT TLS on a non-loopback address because "
                        "allow_insecure is set; anyone on the network can read and forge "
                        "requests and register agents", listen=cfg.listen)
        elif not cfg.tls:
            log.info("serving WITHOUT TLS on loopback only", listen=cfg.listen)
        elif not cfg.tls_client_ca:
            log.warning("TLS without tls_client_ca: node agents cannot register")
        return auth.AuthInterceptor(self.tokens, tls=cfg.tls, agent_hint=cfg.agent_address)

    def _claim(self) -> None:
        """Lock the store file and check that the ports are free, so a second
        controller refuses to start with one line naming the other holder."""
        cfg = self.config
        check_bindable(cfg.listen, "listen")  # first: a refused start leaves no lock file
        for name, address in (("agent_listen", cfg.agent_address),
                              ("metrics_listen", cfg.metrics_listen)):
            if address:
                check_bindable(address, name)
        # A shared (PostgreSQL) store has no file to lock: controllers share it.
        if cfg.store_target != ":memory:" and not is_postgres(cfg.store_target):
            self._lock = StoreLock(cfg.store_target, f"listen {cfg.listen}")

    def _bind(self, server: grpc.aio.Server) -> None:
        cfg = self.config
        try:
            # the files are re-read when they change: rotation needs no restart
            certs = (ReloadingCertificates(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
                     if cfg.tls else None)
            self.port = _add_port(server, "listen", cfg.listen,
                                  certs.credentials() if certs else None)
            agent_listen = cfg.agent_address
            if not agent_listen:
                return
            # every connection here presents a certificate from tls_client_ca
            self.agent_port = _add_port(
                server, "agent_listen", agent_listen,
                certs.credentials(require_client_cert=True) if certs else None)
        except ValueError as err:  # an unreadable or malformed PEM file
            raise ConfigError(str(err)) from None
        self._auth.agent_hint = f"{agent_listen.rpartition(':')[0]}:{self.agent_port}"

    def reload_tokens(self) -> bool:
        """Read the tokens file again now (SIGHUP); False if it failed or is not set."""
        return self.tokens.reload() if self.tokens is not None else False

    def reload(self) -> None:
        """SIGHUP: the tokens file and the queues file, each read again if set."""
        self.reload_tokens()
        self.reload_queues()

    def _read_queues(self) -> QueueSet:
        """At start: the queues of queues_file (a bad file stops the start, ConfigError),
        else the config's [queues] table."""
        path = self.config.queues_file
        return read_queues_file(path) if path else self.config.queues

    def reload_queues(self) -> bool:
        """Read the queues again (SIGHUP): queues_file if set, else the [queues] of the
        configuration file the controller was started with. Never silent: the outcome
        is logged and recorded (a RELOAD event): applied, with what changed; unchanged;
        or, for a bad file, refused with the error (the last good queues stay in force,
        as the tokens do); False then, or with neither file. The new queues reach the
        state machine as an event, in order with the RPCs around it."""
        path = self.config.queues_file or self.config.config_file
        if not path:
            self._note(pb.EVENT_KIND_RELOAD, "SIGHUP: the queues are not reloaded: they come "
                       "from neither a queues_file nor a configuration file")
            return False
        try:
            queues = (read_queues_file(path) if self.config.queues_file
                      else read_config_queues(path))
        except ConfigError as err:
            log.error("queues not reloaded; keeping the previous queues", error=str(err))
            self._note(pb.EVENT_KIND_RELOAD, f"SIGHUP: the queues of {path} are refused, "
                       f"the previous ones stay in force: {err}")
            return False
        changed = changes(self._queues, queues)
        self._note(pb.EVENT_KIND_RELOAD, f"SIGHUP: the queues of {path} reloaded: {changed}")
        if changed != "unchanged":
            self.post(sm.QueuesLoaded(self.clock.time(), queues))
            self._queues_in_force(queues)
        return True

    def _queues_in_force(self, queues: QueueSet) -> None:
        """Say what the queues are (and which jobs a removed queue leaves in the default
        one); start their preemption counters at 0. The next term starts with them."""
        self._queues = queues
        orphans = collections.Counter(
            r.job.spec.queue for r in self.state.jobs.values()
            if r.state not in sm.TERMINAL and scheduled_in(queues, r.job.spec)[2])
        log.info("queues", queues=[q.name for q in queues.queues],
                 guaranteed={q.name: dict(q.guarantee) for q in queues.queues if q.guarantee},
                 source=self.config.queues_file or "config")
        if orphans:
            log.warning("jobs of queues no longer configured are scheduled in the default "
                        "queue", jobs=dict(orphans))
        self._oversubscribed = None  # said again at the next round, for the new queues
        if self.telemetry is not None:
            self.telemetry.count_preemptions(
                [(q.name, r) for q in queues.queues for r in PREEMPTION_REASONS], zero=True)

    def _check_oversubscribed(self) -> None:
        """Warn when the queues' guarantees of a type add up to more than the ready GPUs
        (not every guarantee can be met); once per change, at rounds."""
        capacity = self.state.gpus_capacity()
        over = {t: self.state.queues.guarantees(t)
                for t in self.state.queues.oversubscribed(capacity)}
        if over == self._oversubscribed:
            return
        self._oversubscribed = over
        if over:
            log.warning("the queues' guarantees exceed the cluster's GPUs: not every guarantee "
                        "can be met", guaranteed=over,
                        ready={t: capacity.get(t, 0) for t in over})


def _add_port(server: grpc.aio.Server, what: str, address: str,
              creds: grpc.ServerCredentials | None) -> int:
    """Bind `address` (TLS with `creds`); the bound port, or OSError naming it."""
    try:
        port = (server.add_secure_port(address, creds) if creds is not None
                else server.add_insecure_port(address))
    except RuntimeError as err:
        if "bind" not in str(err):  # grpc: a malformed certificate or key
            raise ConfigError(f"tls_cert/tls_key: {err}") from None
        port = 0  # taken since check_bindable looked: the same answer
    if port == 0:
        check_bindable(address, what)  # says why, when it can
        raise OSError(f"{what} {address}: cannot bind")
    return port
