"""TLS failures over real gRPC on loopback: the client error names the cause."""
from concurrent import futures

import grpc
import pytest

from replikafka import errors as E
from replikafka.client.connection import ConnectionPool
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.security import tls
from replikafka.security.certs import CertificateAuthority


def _read(p):
    with open(p, "rb") as f:
        return f.read()


@pytest.fixture
def ca(tmp_path):
    return CertificateAuthority(str(tmp_path / "pki"))


def _server(cert_files, require_client_auth=False):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    creds = grpc.ssl_server_credentials([(_read(cert_files.key), _read(cert_files.certificate))],
                                        root_certificates=_read(cert_files.ca),
                                        require_client_auth=require_client_auth)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, f"127.0.0.1:{port}"


def test_an_expired_broker_certificate_is_named(ca):
    server, target = _server(ca.issue("broker", expired=True))
    try:
        pool = ConnectionPool(security={"security.protocol": "SSL", "ssl.ca.location": ca.ca_path})
        with pytest.raises(E.SslAuthenticationError, match="the broker's certificate has expired"):
            pool.call(target, "Metadata", pb.MetadataRequest(), 3)
        pool.close()
    finally:
        server.stop(0)


def test_a_broker_will_not_serve_an_expired_or_unreadable_certificate(ca, tmp_path):
    expired = ca.issue("broker", expired=True, file_stem="old")
    with pytest.raises(E.SslAuthenticationError, match="expired on"):
        tls.server_credentials(ca.ca_path, expired.certificate, expired.key, None, "required")
    good = ca.issue("broker", key_password="pw")
    tls.server_credentials(ca.ca_path, good.certificate, good.key, "pw", "required")
    with pytest.raises(E.InvalidConfigError, match="ssl.key.location .* with ssl.key.password"):
        tls.server_credentials(ca.ca_path, good.certificate, good.key, "wrong", "required")
    with pytest.raises(E.InvalidConfigError, match="ssl.client.auth=requested"):
        tls.server_credentials(ca.ca_path, good.certificate, good.key, "pw", "requested")
    with pytest.raises(E.InvalidConfigError, match="ssl.ca.location: cannot read"):
        tls.server_credentials(str(tmp_path / "missing.pem"), good.certificate, good.key, "pw", "required")


def test_plaintext_and_tls_mismatches_are_named(ca):
    server, target = _server(ca.issue("broker"))
    try:
        plain = ConnectionPool()
        with pytest.raises(E.SslAuthenticationError, match="speaks TLS but security.protocol is PLAINTEXT"):
            plain.call(target, "Metadata", pb.MetadataRequest(), 3)
        plain.close()
    finally:
        server.stop(0)
    insecure = grpc.server(futures.ThreadPoolExecutor(2))
    port = insecure.add_insecure_port("127.0.0.1:0")
    insecure.start()
    try:
        pool = ConnectionPool(security={"security.protocol": "SSL", "ssl.ca.location": ca.ca_path})
        with pytest.raises(E.SslAuthenticationError, match="does not speak TLS"):
            pool.call(f"127.0.0.1:{port}", "Metadata", pb.MetadataRequest(), 3)
        pool.close()
    finally:
        insecure.stop(0)
