"""The HTTP port's security (``metrics.listener``): the same TLS files, credentials,
principals and ACLs as the broker's RPC listeners (:class:`replikafka.broker.security.BrokerSecurity`).

- TLS: Python's ``ssl`` module with the broker's ``ssl.certificate.location`` /
  ``ssl.key.location`` (``ssl.key.password``); a client certificate is asked for
  (not required) and verified against ``ssl.ca.location`` when presented. With
  ``authorizer.class.name`` set the port speaks HTTPS only (``https://`` in
  ``metrics.listener`` asks for it without an authorizer too).
- Principal (with an authorizer, every request needs one): ``Authorization: Basic``
  checked against the user's SCRAM credential in ZooKeeper by the same check
  SASL_SSL listeners use (``BrokerSecurity.password_principal``, as PLAIN: the
  password travels over TLS); without that header, the verified client
  certificate's subject through ``ssl.principal.mapping.rules``. Neither: 401.
- ACLs: reads (``/metrics``, the status page, ``/status.json``,
  ``/replicas.json``, ``GET /loggers``) need Describe on the cluster, ``POST
  /loggers`` needs Alter on the cluster (``super.users`` may do both). A refusal
  is 403 naming the principal, operation and resource, logged as RPC refusals are.

Thread-safety: immutable after construction; the credential and ACL caches it
asks are BrokerSecurity's (thread-safe).
"""
from __future__ import annotations

import base64
import binascii
import ssl

from replikafka import errors as E
from replikafka.broker.rpc_server import RequestContext
from replikafka.broker.security import CLUSTER
from replikafka.security.tls import check_not_expired

#: The WSGI environ key holding the verified client certificate's subject (``CN=alice,O=acme``).
PEER_SUBJECT = "replikafka.peer_subject"
#: HTTP Basic is a password over TLS: checked as SASL/PLAIN checks it (any SCRAM credential of the user).
BASIC_MECHANISM = "PLAIN"
NEEDS_CREDENTIALS = ("this port needs a principal: HTTP Basic with a user's SCRAM name and password "
                     "(curl -u USER:PASSWORD), or a client certificate signed by the broker's ssl.ca.location")


def operation_of(method: str, path: str) -> str:
    """The ACL operation on the cluster an HTTP request needs (Kafka's names)."""
    return "Alter" if path == "/loggers" and method == "POST" else "Describe"


def basic_credentials(header: str) -> tuple[str, str]:
    """``Basic base64(user:password)`` -> (user, password), or an authentication error naming the problem."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise E.SaslAuthenticationFailedError(f"Authorization scheme {scheme or '(empty)'!r} is not supported; "
                                              f"use Basic (a user's SCRAM name and password)")
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise E.SaslAuthenticationFailedError("the Authorization: Basic value is not base64 of user:password") from None
    if not sep or not user:
        raise E.SaslAuthenticationFailedError("the Authorization: Basic value is not base64 of user:password")
    return user, password


def server_context(config) -> ssl.SSLContext:
    """TLS for the HTTP port from the broker's PEM files (a client certificate optional)."""
    cert, key = config.get("ssl.certificate.location"), config.get("ssl.key.location")
    for path, name in ((cert, "ssl.certificate.location"), (key, "ssl.key.location")):
        if not path:
            raise E.InvalidConfigError(f"metrics.listener over HTTPS needs {name}")
    check_not_expired(cert)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key, password=config.get("ssl.key.password") or None)
    except (ssl.SSLError, OSError) as exc:
        raise E.InvalidConfigError(f"metrics.listener over HTTPS: ssl.certificate.location {cert!r} / "
                                   f"ssl.key.location {key!r} cannot be loaded: {exc}") from None
    ca = config.get("ssl.ca.location")
    if ca:
        try:
            ctx.load_verify_locations(ca)
        except (ssl.SSLError, OSError) as exc:
            raise E.InvalidConfigError(f"ssl.ca.location {ca!r} cannot be loaded: {exc}") from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


class HttpSecurity:
    """Authentication and authorization of the HTTP port's requests (see the module docstring)."""

    def __init__(self, security):
        self.security = security     # BrokerSecurity, started (credentials and ACL caches running)

    def authenticate(self, environ) -> str:
        header = environ.get("HTTP_AUTHORIZATION")
        if header:
            user, password = basic_credentials(header)
            return self.security.password_principal(BASIC_MECHANISM, user, password)
        subject = environ.get(PEER_SUBJECT)
        if subject:
            return f"User:{self.security.mapper.name_of(subject)}"
        raise E.AuthenticationError(NEEDS_CREDENTIALS)

    def authorize(self, principal: str, environ) -> None:
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        host = environ.get("REMOTE_ADDR", "")
        peer = f"ipv6:[{host}]:0" if ":" in host else f"ipv4:{host}:0"   # as gRPC names peers
        ctx = RequestContext(method=f"HTTP {method} {path}", listener="HTTPS", peer=peer,
                             principal=principal, grpc_context=None, gate=self.security)
        self.security.require(ctx, operation_of(method, path), CLUSTER)
