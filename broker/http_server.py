"""The broker's HTTP port (``metrics.listener``): Prometheus metrics, the cluster
status page and runtime log levels.

Routes:

* ``GET /metrics``: Prometheus text (prometheus_client's own WSGI app over the
  broker's registry: gzip and ``name[]`` filtering included);
* ``GET /`` (or ``/status``): the cluster status page (``status_page.py``);
  ``GET /status.json``: the same data as JSON;
* ``GET /replicas.json?tp=topic:0&...``: this broker's view of its replicas
  (HW, LEO, log start, followers' fetch offsets), read by other brokers' pages;
* ``GET /loggers``: levels as JSON; ``POST /loggers`` with ``logger=NAME&level=LEVEL``
  (form or query) changes one at runtime.

Security: every request goes through :attr:`BrokerHttpServer.authenticate`
(``environ -> principal``, raising :class:`errors.AuthenticationError` to refuse
with 401) and :attr:`BrokerHttpServer.authorize` (``(principal, environ)``,
raising :class:`errors.AuthorizationError` to refuse with 403), allow-all by
default. With an authorizer configured, :func:`start_http` plugs in
``http_security.HttpSecurity`` (the broker's own credentials, principals and
ACLs) and serves HTTPS only (``tls_context``): the TLS handshake runs in the
connection's thread, and a plain HTTP request to the port is answered 400
naming the scheme to use.

Thread-safety: one thread per connection (bounded by ``MAX_THREADS``: beyond it
a connection waits in the listen backlog); handlers only read broker state.
"""
from __future__ import annotations

import json
import logging
import socket
import socketserver
import ssl
import threading
import urllib.parse
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from replikafka import errors as E
from replikafka.broker import log_levels

log = logging.getLogger("replikafka.http")
MAX_THREADS = 16
POST_BODY_BYTES_MAX = 64 << 10
IO_TIMEOUT_S = 30.0           # a connection's TLS handshake, request and reply each get this long
PLAIN_HTTP_DRAIN_BYTES_MAX = 64 << 10
TLS_HANDSHAKE_RECORD = b"\x16"


def _plain_http_refusal() -> bytes:
    body = (b"this port serves HTTPS only: use https:// (with a user's name and password, "
            b"or a client certificate)\n")
    return (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_THREADS)
        self.tls_context: ssl.SSLContext | None = None   # set: HTTPS only

    def process_request(self, request, client_address):
        self._slots.acquire()
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            if self.tls_context is not None:
                secured = self._handshake(request, client_address)
                if secured is None:
                    self.shutdown_request(request)
                    return
                request = secured
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _handshake(self, sock: socket.socket, client_address) -> ssl.SSLSocket | None:
        """TLS on an accepted connection (in its own thread: a slow client holds only its
        slot); a plain HTTP request is answered 400 naming HTTPS. None: refused."""
        sock.settimeout(IO_TIMEOUT_S)
        try:
            first = sock.recv(1, socket.MSG_PEEK)
            if first and first != TLS_HANDSHAKE_RECORD:
                sock.sendall(_plain_http_refusal())
                sock.shutdown(socket.SHUT_WR)
                drained = 0   # read what the client sent, so closing does not reset the reply away
                while drained < PLAIN_HTTP_DRAIN_BYTES_MAX:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    drained += len(chunk)
                return None
            return self.tls_context.wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.debug("HTTPS handshake with %s failed: %s", client_address[0], exc)
            return None


class _QuietHandler(WSGIRequestHandler):
    timeout = IO_TIMEOUT_S

    def log_message(self, format, *args):   # not one broker-log line per scrape
        log.debug("%s %s", self.address_string(), format % args)

    def get_environ(self):
        environ = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            from replikafka.broker.http_security import PEER_SUBJECT
            environ["HTTPS"] = "on"
            der = self.connection.getpeercert(binary_form=True)   # verified against ssl.ca.location
            if der:
                environ[PEER_SUBJECT] = certificate_subject(der)
        return environ


def certificate_subject(der: bytes) -> str:
    """A certificate's subject as gRPC shows it to ``ssl.principal.mapping.rules`` (RFC 4514)."""
    from cryptography import x509
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def open_access(environ) -> str:
    return "User:ANONYMOUS"


def allow_all(principal: str, environ) -> None:
    return None


class BrokerHttpServer:
    def __init__(self, host: str, port: int, registry, status_view=None, local_replicas=None):
        self.authenticate = open_access            # security: environ -> principal (raise to refuse: 401)
        self.authorize = allow_all                 # security: (principal, environ), raise to refuse: 403
        self.metrics_app = make_wsgi_app(registry)
        self.status_view = status_view             # status_page.ClusterView, or None (no page)
        self.local_replicas = local_replicas       # (tps or None) -> dict
        self.server = make_server(host, port, self.app, server_class=_Server, handler_class=_QuietHandler)
        self.host = host or "127.0.0.1"
        self.port = self.server.server_address[1]
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.server.tls_context is not None else 'http'}://{self.host}:{self.port}"

    def serve_tls(self, context: ssl.SSLContext) -> None:
        """HTTPS only from now on (before :meth:`start`)."""
        self.server.tls_context = context

    def start(self) -> "BrokerHttpServer":
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="http-server", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.status_view is not None:
            self.status_view.close()

    # ------------------------------------------------------------ routing
    def app(self, environ, start_response):
        try:
            principal = self.authenticate(environ)
            self.authorize(principal, environ)
        except E.AuthorizationError as exc:
            return _reply(start_response, "403 Forbidden", "text/plain", f"{exc.message}\n")
        except E.ReplikafkaError as exc:   # authentication failed: ask for credentials
            return _reply(start_response, "401 Unauthorized", "text/plain", f"{exc.message}\n",
                          [("WWW-Authenticate", 'Basic realm="replikafka", charset="UTF-8"')])
        path = environ.get("PATH_INFO", "/")
        method = environ.get("REQUEST_METHOD", "GET")
        query = environ.get("QUERY_STRING", "")
        try:
            if path == "/metrics":
                return self.metrics_app(environ, start_response)
            if path in ("/", "/status") and method == "GET" and self.status_view is not None:
                return _reply(start_response, "200 OK", "text/html; charset=utf-8", self.status_view.page(query))
            if path == "/status.json" and self.status_view is not None:
                return _json(start_response, self.status_view.page_json(query))
            if path == "/replicas.json" and self.local_replicas is not None:
                from replikafka.broker.status_page import parse_tps
                tps = urllib.parse.parse_qs(query).get("tp")
                return _json(start_response, self.local_replicas(parse_tps(tps) if tps else None))
            if path == "/loggers":
                if method == "POST":
                    return self._set_logger(environ, principal, start_response)
                return _json(start_response, log_levels.levels())
            return _reply(start_response, "404 Not Found", "text/plain",
                          "not found; try /metrics, /status, /status.json, /loggers\n")
        except E.ReplikafkaError as exc:
            return _reply(start_response, "400 Bad Request", "text/plain", f"{exc}\n")
        except Exception as exc:   # a page bug must not take the broker down
            log.exception("HTTP %s %s failed", method, path)
            return _reply(start_response, "500 Internal Server Error", "text/plain", f"{type(exc).__name__}: {exc}\n")

    def _set_logger(self, environ, principal: str, start_response):
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > POST_BODY_BYTES_MAX:
            raise E.InvalidRequestError(f"request body of {length} bytes is over {POST_BODY_BYTES_MAX}")
        body = environ["wsgi.input"].read(length).decode("utf-8", "replace") if length else ""
        form = urllib.parse.parse_qs(body or environ.get("QUERY_STRING", ""), keep_blank_values=True)
        if "logger" not in form or "level" not in form:
            raise E.InvalidRequestError("POST /loggers needs logger=NAME and level=LEVEL")
        name, level = form["logger"][0], form["level"][0]
        try:
            set_to = log_levels.set_level(name, level)
        except E.InvalidConfigError as exc:
            raise E.InvalidRequestError(str(exc)) from None
        log.info("log level of %s set to %s by %s", name or "root", set_to, principal)
        return _json(start_response, {"logger": name or "root", "level": set_to})


def _reply(start_response, status: str, content_type: str, body: str, headers: list | None = None):
    data = body.encode()
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(data))),
                            ("Cache-Control", "no-store")] + (headers or []))
    return [data]


def _json(start_response, value):
    return _reply(start_response, "200 OK", "application/json", json.dumps(value, sort_keys=True))


def start_http(broker) -> BrokerHttpServer | None:
    """Serve ``metrics.listener`` for a starting broker (None when it is empty). With an
    authorizer it is HTTPS only behind the broker's own authentication and ACLs, and the
    status page asks its peers with the broker's inter-broker credentials."""
    from replikafka.broker.config import http_listener_address
    from replikafka.broker.status_page import ClusterView, local_replicas

    address = http_listener_address(broker.config.get("metrics.listener"))
    if address is None:
        return None
    scheme, host, port = address
    security = broker.security
    secured = security.authorizer_enabled
    peers = PeerHttp(security.inter_broker if (secured or scheme == "https") else None)
    try:
        server = BrokerHttpServer(
            host, port, broker.metrics.registry,
            status_view=ClusterView(broker, lambda: peer_http_urls(broker.store), opener=peers.open),
            local_replicas=lambda tps: local_replicas(broker.replica_manager, tps))
    except OSError as exc:
        raise E.InvalidConfigError(f"metrics.listener: cannot bind {host}:{port}: {exc}") from None
    if secured or scheme == "https":
        from replikafka.broker.http_security import HttpSecurity, server_context
        try:
            server.serve_tls(server_context(broker.config))
        except BaseException:
            server.server.server_close()
            raise
        if secured:
            gate = HttpSecurity(security)
            server.authenticate, server.authorize = gate.authenticate, gate.authorize
    server.host = host or broker.endpoint.host   # bound to every interface: published as the broker's host
    server.start()
    log.info("broker %d: metrics at %s/metrics, status page at %s/%s", broker.broker_id, server.url, server.url,
             " (HTTPS only; a principal and Describe on the cluster needed)" if secured else "")
    return server


class PeerHttp:
    """How this broker asks other brokers' HTTP ports (the status page's ``/replicas.json``):
    over HTTPS with its inter-broker TLS and credentials when it has them."""

    def __init__(self, client_security=None):
        self.headers = client_security.http_headers() if client_security is not None else {}
        self.context = client_security.https_context() if client_security is not None else None

    def open(self, url: str, timeout: float):
        import urllib.request
        request = urllib.request.Request(url, headers=self.headers)
        return urllib.request.urlopen(request, timeout=timeout, context=self.context)


def peer_http_urls(store) -> dict[int, str]:
    """Each live broker's HTTP URL, from its registration (``metrics_url``)."""
    out = {}
    for broker_id, registration in store.broker_registrations().items():
        url = registration.get("metrics_url")
        if url:
            out[broker_id] = url
    return out
