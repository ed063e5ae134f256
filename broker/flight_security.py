"""Security of the Arrow Flight listener: the same TLS files, principals and ACLs
as the gRPC listeners (:class:`replikafka.broker.security.BrokerSecurity`).

- TLS: a broker with any SSL/SASL_SSL listener serves Flight as ``grpc+tls``
  with its ``ssl.certificate.location``/``ssl.key.location``
  (:func:`flight_server_options`). ``ssl.client.auth`` does not apply (as on
  SASL_SSL listeners): Flight callers authenticate with their password.
- Authentication: :class:`FlightSecurityMiddlewareFactory` reads the same
  ``authorization`` header a SASL_SSL gRPC client sends (username/password,
  checked against the salted SCRAM credentials); without one the caller is
  ``User:ANONYMOUS``. pyarrow's Flight does not expose the peer certificate
  to middleware, so a certificate alone gives no named principal on Flight.
  A header sent to a Flight listener without TLS is refused (it would travel
  in clear).
- Authorization: handlers call :func:`require` (DoGet: Read on the topic;
  GetFlightInfo/GetSchema: Describe) and :func:`allowed` (ListFlights lists
  only Describe-able topics); a refusal is FlightUnauthorizedError carrying
  TOPIC_AUTHORIZATION_FAILED and naming the operation and topic.

The Flight server calls these with its ``ServerCallContext``; with no
security configured (no middleware registered) everything is allowed.
"""
from __future__ import annotations

import pyarrow.flight as fl

from replikafka import errors as E
from replikafka.broker.rpc_server import RequestContext
from replikafka.security.acl import ANONYMOUS

MIDDLEWARE_KEY = "security"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def flight_server_options(security) -> dict:
    """Keyword arguments for ``pyarrow.flight.FlightServerBase``: ``tls_certificates`` and
    ``middleware``."""
    if security is None or not security.enabled:
        return {}
    cfg = security.config
    out: dict = {"middleware": {MIDDLEWARE_KEY: FlightSecurityMiddlewareFactory(security, tls=security.tls)}}
    if security.tls:
        from replikafka.security.tls import _key_bytes, check_not_expired
        check_not_expired(cfg.get("ssl.certificate.location"))
        out["tls_certificates"] = [fl.CertKeyPair(cert=_read(cfg.get("ssl.certificate.location")),
                                                  key=_key_bytes(cfg.get("ssl.key.location"),
                                                                 cfg.get("ssl.key.password")))]
    return out


class FlightSecurityMiddleware(fl.ServerMiddleware):
    def __init__(self, principal: str):
        self.principal = principal


class FlightSecurityMiddlewareFactory(fl.ServerMiddlewareFactory):
    """Authenticates every Flight call from its headers (see the module docstring)."""

    def __init__(self, security, tls: bool):
        self.security = security
        self.tls = tls

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get(b"authorization") or []
        if not values:
            return FlightSecurityMiddleware(ANONYMOUS)
        if not self.tls:
            raise fl.FlightUnauthenticatedError(
                "SASL_AUTHENTICATION_FAILED: credentials sent to a Flight listener without TLS are refused")
        value = values[0].decode() if isinstance(values[0], bytes) else values[0]
        try:
            principal = self.security.sasl_principal(value)
        except E.ReplikafkaError as exc:
            raise fl.FlightUnauthenticatedError(f"{exc.code}: {exc.message}") from None
        return FlightSecurityMiddleware(principal)


def allowed(context, security, operation: str, topic: str) -> bool:
    """May this Flight call's principal do ``operation`` on ``topic``?"""
    mw = context.get_middleware(MIDDLEWARE_KEY)
    if mw is None or security is None:
        return True
    ctx = RequestContext("Flight", "FLIGHT", context.peer(), mw.principal, context, security)
    return security.allowed(ctx, operation, ("Topic", topic))


def require(context, security, operation: str, topic: str) -> None:
    """Raise FlightUnauthorizedError (TOPIC_AUTHORIZATION_FAILED, naming the operation and
    topic) unless the caller may do ``operation`` on ``topic``."""
    if not allowed(context, security, operation, topic):
        mw = context.get_middleware(MIDDLEWARE_KEY)
        raise fl.FlightUnauthorizedError(
            f"{E.TopicAuthorizationFailedError.code}: {mw.principal} is not allowed {operation} on Topic {topic!r}")
