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

Authentication: every request goes through :attr:`BrokerHttpServer.authenticate`
(``environ -> principal``, raising :class:`errors.AuthenticationError` to refuse
with 401), allow-all by default. Security replaces it with the broker's own
authenticator so the page and the metrics sit behind the same credentials as
the RPCs; ``POST /loggers`` also asks :attr:`authorize_alter` (ClusterAction
on the cluster, in Kafka's terms).

Thread-safety: one thread per connection (bounded by ``MAX_THREADS``: beyond it
a connection waits in the listen backlog); handlers only read broker state.
"""
from __future__ import annotations

import json
import logging
import socketserver
import threading
import urllib.parse
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from replikafka import errors as E
from replikafka.broker import log_levels

log = logging.getLogger("replikafka.http")
MAX_THREADS = 16
POST_BODY_BYTES_MAX = 64 << 10


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_THREADS)

    def process_request(self, request, client_address):
        self._slots.acquire()
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):   # not one broker-log line per scrape
        log.debug("%s %s", self.address_string(), format % args)


def open_access(environ) -> str:
    return "User:ANONYMOUS"


def allow_all(principal: str, environ) -> bool:
    return True


class BrokerHttpServer:
    def __init__(self, host: str, port: int, registry, status_view=None, local_replicas=None):
        self.authenticate = open_access            # security: environ -> principal (raise to refuse)
        self.authorize_alter = allow_all           # security: may this principal change log levels?
        self.metrics_app = make_wsgi_app(registry)
        self.status_view = status_view             # status_page.ClusterView, or None (no page)
        self.local_replicas = local_replicas       # (tps or None) -> dict
        self.server = make_server(host, port, self.app, server_class=_Server, handler_class=_QuietHandler)
        self.host = host or "127.0.0.1"
        self.port = self.server.server_address[1]
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
        except E.ReplikafkaError as exc:
            return _reply(start_response, "401 Unauthorized", "text/plain", f"{exc}\n")
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
        if not self.authorize_alter(principal, environ):
            return _reply(start_response, "403 Forbidden", "text/plain",
                          f"{principal} may not change log levels\n")
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


def _reply(start_response, status: str, content_type: str, body: str):
    data = body.encode()
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(data))),
                            ("Cache-Control", "no-store")])
    return [data]


def _json(start_response, value):
    return _reply(start_response, "200 OK", "application/json", json.dumps(value, sort_keys=True))


def start_http(broker) -> BrokerHttpServer | None:
    """Serve ``metrics.listener`` for a starting broker (None when it is empty)."""
    from replikafka.broker.config import http_listener_address
    from replikafka.broker.status_page import ClusterView, local_replicas

    address = http_listener_address(broker.config.get("metrics.listener"))
    if address is None:
        return None
    host, port = address
    try:
        server = BrokerHttpServer(
            host, port, broker.metrics.registry,
            status_view=ClusterView(broker, lambda: peer_http_urls(broker.store)),
            local_replicas=lambda tps: local_replicas(broker.replica_manager, tps))
    except OSError as exc:
        raise E.InvalidConfigError(f"metrics.listener: cannot bind {host}:{port}: {exc}") from None
    server.host = host or broker.endpoint.host   # bound to every interface: published as the broker's host
    server.start()
    log.info("broker %d: metrics at %s/metrics, status page at %s/", broker.broker_id, server.url, server.url)
    return server


def peer_http_urls(store) -> dict[int, str]:
    """Each live broker's HTTP URL, from its registration (``metrics_url``)."""
    out = {}
    for broker_id, registration in store.broker_registrations().items():
        url = registration.get("metrics_url")
        if url:
            out[broker_id] = url
    return out
