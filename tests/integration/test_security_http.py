"""The HTTP port (metrics, status page, log levels) of a real secure cluster: HTTPS
only, every request needs a principal (HTTP Basic against the SCRAM credentials in
ZooKeeper, or a client certificate through ssl.principal.mapping.rules), reads need
Describe on the cluster and POST /loggers needs Alter; the status page reaches its
peers with the brokers' own credentials."""
from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
import urllib.error
import urllib.request

import pytest

from replikafka import Admin

from cluster_helpers import wait_until

pytestmark = pytest.mark.integration
READS = ("/metrics", "/", "/status.json", "/replicas.json", "/loggers")


def _context(setup, cert_user: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=setup.ca.ca_path)
    if cert_user:
        c = setup.user_certs[cert_user]
        ctx.load_cert_chain(c.certificate, c.key)
    return ctx


def _get(setup, url: str, user: str | None = None, password: str | None = None, cert_user: str | None = None,
         data: bytes | None = None) -> tuple[int, str, dict]:
    headers = {}
    if user is not None:
        pw = setup.passwords[user] if password is None else password
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20, context=_context(setup, cert_user)) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def _acls(zk_connect, monkeypatch, setup, *args):
    from replikafka.cli.main import main
    monkeypatch.setenv("REPLIKAFKA_ZK_DIGEST", ":".join(setup.zk_digest))
    assert main(["acls", "--zookeeper", zk_connect, *args]) == 0


def test_http_port_needs_a_principal_and_cluster_acls(secure, zk_connect, monkeypatch):
    setup, cluster = secure
    url = cluster.metrics_url(cluster.ids[0])
    assert url.startswith("https://")
    with Admin({"bootstrap.servers": cluster.bootstrap_for("SSL"), **setup.client_config("admin", "SSL")}) as admin:
        admin.create_topic("pages", partitions=4, replication_factor=1)   # leaders on both brokers

    # ---- plain HTTP to the HTTPS port: refused, naming the scheme
    conn = http.client.HTTPConnection("127.0.0.1", cluster.metrics_ports[cluster.ids[0]], timeout=10)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 400 and "serves HTTPS only" in resp.read().decode()
    conn.close()

    # ---- no principal, a wrong password, an unknown user: 401 naming what is wrong
    for path in READS:
        status, body, headers = _get(setup, url + path)
        assert status == 401 and "needs a principal" in body, (path, status, body)
        assert headers.get("WWW-Authenticate", "").startswith("Basic")
    status, body, _ = _get(setup, url + "/metrics", "alice", password="not-her-password")
    assert status == 401 and "authentication failed for user 'alice'" in body and "wrong password" in body
    status, body, _ = _get(setup, url + "/metrics", "mallory", password="x")
    assert status == 401 and "unknown user" in body
    status, body, _ = _get(setup, url + "/loggers", "alice", password="wrong",
                           data=b"logger=replikafka&level=DEBUG")
    assert status == 401

    # ---- authenticated without Describe on the cluster (password or certificate): 403 naming it
    for path in READS:
        status, body, _ = _get(setup, url + path, "alice")
        assert status == 403 and "User:alice" in body and "Describe on Cluster" in body, (path, status, body)
    status, body, _ = _get(setup, url + "/metrics", cert_user="bob")   # mTLS: User:bob by the mapping rule
    assert status == 403 and "User:bob" in body and "Describe on Cluster" in body, body
    status, body, _ = _get(setup, url + "/loggers", "alice", data=b"logger=replikafka&level=DEBUG")
    assert status == 403 and "Alter on Cluster" in body

    # ---- a super user, by password and by certificate: every read, and log levels
    for path in READS:
        assert _get(setup, url + path, "admin")[0] == 200, path
    status, body, _ = _get(setup, url + "/metrics", cert_user="admin")
    assert status == 200 and "kafka_server_replicamanager_partitioncount" in body.lower()
    status, body, _ = _get(setup, url + "/loggers", "admin", data=b"logger=replikafka.test.http&level=DEBUG")
    assert status == 200 and json.loads(body)["level"] == "DEBUG"

    # ---- the status page asks the other broker for its partitions with the brokers' credentials
    page = json.loads(_get(setup, url + "/status.json", "admin")[1])
    remote = [p for p in page["partitions"] if p["leader"] != cluster.ids[0]]
    assert remote and all(p["detail"] is not None for p in remote), page["partitions"]

    # ---- Describe on the cluster for alice: reads allowed live; changing log levels still needs Alter
    _acls(zk_connect, monkeypatch, setup, "--add", "--allow-principal", "User:alice", "--operation", "Describe",
          "--cluster")
    wait_until(lambda: _get(setup, url + "/metrics", "alice")[0] == 200, timeout_s=5, what="alice's Describe")
    for path in READS:
        assert _get(setup, url + path, "alice")[0] == 200, path
    assert _get(setup, url + "/metrics", cert_user="bob")[0] == 403
    status, body, _ = _get(setup, url + "/loggers", "alice", data=b"logger=replikafka.test.http&level=INFO")
    assert status == 403 and "User:alice" in body and "Alter on Cluster" in body
    _acls(zk_connect, monkeypatch, setup, "--add", "--allow-principal", "User:alice", "--operation", "Alter",
          "--cluster")
    wait_until(lambda: _get(setup, url + "/loggers", "alice", data=b"logger=replikafka.test.http&level=INFO")[0]
               == 200, timeout_s=5, what="alice's Alter")
    levels = json.loads(_get(setup, url + "/loggers", "alice")[1])
    assert levels["replikafka.test.http"] == "INFO"
    # the broker kept serving through all of it
    time.sleep(0.2)
    assert all(cluster.alive(b) for b in cluster.ids)
