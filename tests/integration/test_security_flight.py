"""The Flight listener's security hooks (broker/flight_security.py) on a real
pyarrow Flight server over TLS, with credentials and ACLs in a real ZooKeeper."""
import time

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from replikafka.broker import flight_security as FS
from replikafka.broker.config import BrokerConfig
from replikafka.broker.security import BrokerSecurity
from replikafka.security import acl as A
from replikafka.security import scram
from replikafka.security.certs import CertificateAuthority
from replikafka.security.tls import ClientSecurity
from replikafka.security.zk_security import AclStore, CredentialStore

pytestmark = pytest.mark.integration
TABLE = pa.table({"v": [1, 2, 3]})


class _Server(fl.FlightServerBase):
    """A stand-in for the broker's Flight handlers: it asks exactly what they ask."""

    def __init__(self, location, security, **kw):
        super().__init__(location, **kw)
        self.security = security

    def do_get(self, context, ticket):
        FS.require(context, self.security, "Read", ticket.ticket.decode())
        return fl.RecordBatchStream(TABLE)

    def list_flights(self, context, criteria):
        for topic in ("orders", "secret"):
            if FS.allowed(context, self.security, "Describe", topic):
                yield fl.FlightInfo(TABLE.schema, fl.FlightDescriptor.for_path(topic), [], -1, -1)


def _security(tmp_path, zk_connect, ssl: bool, ca=None):
    files = ca.issue("broker") if ca else None
    cfg = {"broker.id": 1, "zookeeper.connect": zk_connect, "authorizer.class.name": "AclAuthorizer",
           "listeners": "SSL://127.0.0.1:0,FLIGHT://127.0.0.1:0" if ssl else "PLAINTEXT://127.0.0.1:0,FLIGHT://127.0.0.1:0"}
    if ssl:
        cfg.update({"security.inter.broker.protocol": "SSL", "ssl.ca.location": files.ca,
                    "ssl.certificate.location": files.certificate, "ssl.key.location": files.key})
    return BrokerSecurity(BrokerConfig.from_dict(cfg))


def test_flight_calls_use_the_same_principals_and_acls(tmp_path, zk_connect, kazoo_factory):
    ca = CertificateAuthority(str(tmp_path / "pki"))
    security = _security(tmp_path, zk_connect, ssl=True, ca=ca)
    zk = kazoo_factory()
    security.start(zk, ())
    CredentialStore(zk).alter("alice", {"SCRAM-SHA-512": scram.make_credential("SCRAM-SHA-512", "alice-pw")})
    AclStore(zk).change(A.ResourcePattern("Topic", "orders"), add=frozenset({A.AclEntry("User:alice", "*", "Read", "Allow")}))
    time.sleep(0.5)
    server = _Server("grpc+tls://127.0.0.1:0", security, **FS.flight_server_options(security))
    try:
        def client(cfg):
            sec = ClientSecurity.from_config(cfg)
            opts = sec.flight_client_options()
            c = fl.FlightClient(f"{opts.pop('scheme')}://127.0.0.1:{server.port}", **opts)
            return c, fl.FlightCallOptions(headers=sec.flight_headers(), timeout=5)

        alice, alice_opts = client({"security.protocol": "SASL_SSL", "ssl.ca.location": ca.ca_path,
                                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                                    "sasl.password": "alice-pw"})
        assert alice.do_get(fl.Ticket(b"orders"), alice_opts).read_all().equals(TABLE)
        assert [f.descriptor.path[0] for f in alice.list_flights(options=alice_opts)] == [b"orders"]
        with pytest.raises(fl.FlightUnauthorizedError, match="User:alice is not allowed Read on Topic 'secret'"):
            alice.do_get(fl.Ticket(b"secret"), alice_opts).read_all()

        anonymous, anon_opts = client({"security.protocol": "SSL", "ssl.ca.location": ca.ca_path})
        with pytest.raises(fl.FlightUnauthorizedError, match="TOPIC_AUTHORIZATION_FAILED: User:ANONYMOUS"):
            anonymous.do_get(fl.Ticket(b"orders"), anon_opts).read_all()
        assert list(anonymous.list_flights(options=anon_opts)) == []

        wrong, wrong_opts = client({"security.protocol": "SASL_SSL", "ssl.ca.location": ca.ca_path,
                                    "sasl.username": "alice", "sasl.password": "nope"})
        with pytest.raises(fl.FlightUnauthenticatedError, match="SASL_AUTHENTICATION_FAILED"):
            wrong.do_get(fl.Ticket(b"orders"), wrong_opts).read_all()

        plain = fl.FlightClient(f"grpc+tcp://127.0.0.1:{server.port}")
        with pytest.raises(fl.FlightError):
            plain.do_get(fl.Ticket(b"orders"), fl.FlightCallOptions(timeout=3)).read_all()
    finally:
        server.shutdown()


def test_flight_refuses_credentials_without_tls(tmp_path, zk_connect, kazoo_factory):
    security = _security(tmp_path, zk_connect, ssl=False)
    security.start(kazoo_factory(), ())
    server = _Server("grpc://127.0.0.1:0", security, **FS.flight_server_options(security))
    try:
        c = fl.FlightClient(f"grpc+tcp://127.0.0.1:{server.port}")
        headers = [(b"authorization", b"Bearer PLAIN YWxpY2U= cHc=")]
        with pytest.raises(fl.FlightUnauthenticatedError, match="without TLS"):
            c.do_get(fl.Ticket(b"orders"), fl.FlightCallOptions(headers=headers, timeout=5)).read_all()
    finally:
        server.shutdown()
