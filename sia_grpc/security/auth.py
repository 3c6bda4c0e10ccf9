"""Who is calling, decided in one place: a grpc.aio server interceptor.

Every RPC passes through `AuthInterceptor`, which wraps the method's handler:

* health checks and server reflection are open (probes, grpcurl);
* `AgentService.Connect` needs, when the controller serves TLS, a client
  certificate verified against `tls_client_ca` (mutual TLS); the peer's identity
  (CN, SANs, OU) is kept for the Register check (`check_node_id`);
* everything else needs `authorization: Bearer <token>` when a tokens file is
  configured; without one every caller is an anonymous admin (the loopback dev
  mode, which the controller logs at startup).

The handler then reads the caller with `current()` (a context variable set for the
RPC's task) and authorizes against it: tenants see their own jobs, admins all.
"""

from __future__ import annotations

import contextvars
import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from sia_grpc.api.errors import ApiError, permission_denied, unauthenticated
from sia_grpc.security.certs import ADMIN_OU
from sia_grpc.security.tokens import ANONYMOUS_ADMIN, Principal, TokenStore

__all__ = ["AuthInterceptor", "PeerCert", "check_node_id", "current", "current_peer"]

_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "sia_principal", default=None)
_PEER: contextvars.ContextVar[PeerCert | None] = contextvars.ContextVar(
    "sia_peer_cert", default=None)

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
AGENT_METHOD = "/sia.v1.AgentService/Connect"


def current() -> Principal:
    """The caller of the RPC being served (an anonymous admin outside one)."""
    return _PRINCIPAL.get() or ANONYMOUS_ADMIN


def current_peer() -> PeerCert | None:
    """The verified client certificate of the agent stream being served, if any."""
    return _PEER.get()


@dataclass(frozen=True)
class PeerCert:
    """A client certificate that the TLS handshake verified."""

    common_name: str
    names: tuple[str, ...]  # subject alternative names
    units: tuple[str, ...]  # organizational units (OU)

    @property
    def any_node(self) -> bool:
        """An admin certificate (OU=admin) may register as any node."""
        return ADMIN_OU in self.units

    def matches(self, node_id: str) -> bool:
        """node_id equals the CN or a SAN, or fits one ending in '*' ("rtx-*")."""
        if self.any_node:
            return True
        for name in (self.common_name, *self.names):
            if name == node_id or (name.endswith("*") and len(name) > 1
                                   and fnmatch.fnmatchcase(node_id, name)):
                return True
        return False


def _values(auth: Mapping[str, Iterable[bytes | str]], key: str) -> list[str]:
    return [v.decode(errors="replace") if isinstance(v, bytes) else str(v)
            for v in auth.get(key, ())]


def peer_cert(context: grpc.aio.ServicerContext) -> PeerCert | None:
    """The peer's verified certificate, from the call's auth context."""
    auth = context.auth_context() or {}
    if b"ssl" not in auth.get("transport_security_type", ()) and \
            "ssl" not in _values(auth, "transport_security_type"):
        return None
    cn = _values(auth, "x509_common_name")
    if not cn:
        return None  # TLS, but no client certificate presented
    subject = ",".join(_values(auth, "x509_subject"))
    units = tuple(m.group(1) for m in re.finditer(r"(?:^|,)\s*OU=((?:\\.|[^,])*)", subject))
    return PeerCert(cn[0], tuple(_values(auth, "x509_subject_alternative_name")), units)


def check_node_id(node_id: str) -> None:
    """PERMISSION_DENIED unless the stream's certificate may register `node_id`
    (no certificate: a plaintext dev controller, nothing to check)."""
    peer = current_peer()
    if peer is not None and not peer.matches(node_id):
        raise permission_denied(
            f"register.node_id {node_id!r} does not match the client certificate "
            f"(CN {peer.common_name!r}, SANs {list(peer.names)}); issue the agent a "
            "certificate for its node id (sia certs issue DIR --agent NODE)",
            "NODE_ID_MISMATCH")


_BEARER = re.compile(r"^Bearer\s+(\S+)\s*$", re.IGNORECASE)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call (see the module docstring).

    `tokens`: the TokenStore, or None for the anonymous-admin dev mode.
    `tls`: the controller serves TLS, so agents must present a client certificate.
    `agent_hint`: where agents should connect, for the error message.
    """

    def __init__(self, tokens: TokenStore | None, *, tls: bool, agent_hint: str = "") -> None:
        self.tokens, self.tls, self.agent_hint = tokens, tls, agent_hint
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}  # per registered method

    # -- decisions --

    def principal(self, metadata) -> Principal:
        if self.tokens is None:
            return ANONYMOUS_ADMIN
        header = None
        for key, value in metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode(errors="replace")
                break
        if header is None:
            raise unauthenticated(
                "missing bearer token: send metadata 'authorization: Bearer <token>' "
                "(sia --token-file F, or SIA_TOKEN)", "TOKEN_MISSING")
        m = _BEARER.match(header)
        if m is None:
            raise unauthenticated("malformed authorization metadata: expected 'Bearer <token>'",
                                  "TOKEN_MALFORMED")
        found = self.tokens.lookup(m.group(1))
        if found is None:
            raise unauthenticated("invalid or revoked token", "TOKEN_INVALID")
        return found

    def agent(self, context: grpc.aio.ServicerContext) -> PeerCert | None:
        if not self.tls:
            return None  # plaintext (loopback dev, or allow_insecure): nothing to verify
        peer = peer_cert(context)
        if peer is None:
            where = f" (the agent port, {self.agent_hint})" if self.agent_hint else ""
            raise unauthenticated(
                "AgentService.Connect requires a client certificate signed by the cluster CA "
                f"(tls_client_ca): connect the agent to the mutual-TLS port{where} with "
                "--tls-ca, --tls-cert and --tls-key", "CLIENT_CERT_REQUIRED")
        return peer

    def _admit(self, method: str, context, metadata) -> Callable[[], None]:
        """Authenticate; returns the undo for the context variables set."""
        if method == AGENT_METHOD:
            peer = self.agent(context)
            t1 = _PEER.set(peer)
            t2 = _PRINCIPAL.set(Principal("", "agent", peer.common_name if peer else ""))

            def undo() -> None:
                _PEER.reset(t1)
                _PRINCIPAL.reset(t2)

            return undo
        t = _PRINCIPAL.set(self.principal(metadata))
        return lambda: _PRINCIPAL.reset(t)

    # -- the interceptor --

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_PREFIXES):
            return await continuation(handler_call_details)
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = await continuation(handler_call_details)
            if handler is None:
                return None  # unknown method (not cached: the names are the caller's)
            wrapped = self._wrapped[method] = self._wrap(method, handler)
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` with the authentication of `method` in front."""
        admit = self._admit

        async def enter(context) -> Callable[[], None]:
            try:
                return admit(method, context, context.invocation_metadata())
            except ApiError as err:
                await context.abort_with_status(err.to_status())  # raises
                raise

        def unary(inner):  # one response: the context variables are reset after it
            async def call(request, context):
                undo = await enter(context)
                try:
                    return await inner(request, context)
                finally:
                    undo()
            return call

        def streaming(inner):
            async def call(request, context):
                await enter(context)
                # No reset: the generator's frames may resume in other contexts;
                # the RPC's task (and its context copy) ends with the call.
                async for item in inner(request, context):
                    yield item
            return call

        for kind, make, wrap in (
                ("unary_unary", grpc.unary_unary_rpc_method_handler, unary),
                ("unary_stream", grpc.unary_stream_rpc_method_handler, streaming),
                ("stream_stream", grpc.stream_stream_rpc_method_handler, streaming),
                ("stream_unary", grpc.stream_unary_rpc_method_handler, unary)):
            inner = getattr(handler, kind)
            if inner is not None:
                return make(wrap(inner), request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler
