"""A real secure cluster (TLS on every listener, mTLS and SASL principals, ACLs,
ZooKeeper ACLs): every RPC refuses unauthenticated and unauthorized callers and
nothing changes; forged controller and follower requests are refused; ACL
changes take effect live; bad certificates are refused with the cause named."""
import hashlib
import json
import os
import time

import pytest
from kazoo.exceptions import NoAuthError

from replikafka import Admin, Consumer, Producer
from replikafka import errors as E
from replikafka.client.connection import ConnectionPool
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.security.certs import CertificateAuthority

from cluster_helpers import flight_batch, flight_put, kafka_batch, wait_until

pytestmark = pytest.mark.integration
TOPIC = "orders"


def _client(cls, cluster, setup, user, protocol="SASL_SSL", **kw):
    return cls({"bootstrap.servers": cluster.bootstrap_for(protocol), **setup.client_config(user, protocol),
                "request.timeout.ms": 5000, **kw})


def _state(cluster, zk):
    """What must not change: every znode under the state roots, every data file."""
    znodes = {}

    def walk(path):
        data, stat = zk.get(path)
        znodes[path] = (data, stat.version)
        for child in zk.get_children(path):
            walk(f"{path.rstrip('/')}/{child}")
    for root in ("/brokers/topics", "/config/topics", "/admin", "/kafka-acl", "/controller_epoch"):
        if zk.exists(root):
            walk(root)
    files = {}
    for bid in cluster.ids:
        top = os.path.join(cluster.base_dir, f"broker-{bid}-logs")
        for dirpath, _, names in os.walk(top):
            for n in names:
                if n.endswith((".arrows", ".index", ".timeindex")):
                    p = os.path.join(dirpath, n)
                    with open(p, "rb") as f:
                        files[p] = hashlib.sha256(f.read()).hexdigest()
    return znodes, files


def _read_all(consumer, partitions):
    consumer.assign([(TOPIC, p) for p in range(partitions)])
    for p in range(partitions):
        consumer.seek((TOPIC, p), 0)
    ends = consumer.end_offsets([(TOPIC, p) for p in range(partitions)])
    got = []
    deadline = time.time() + 20
    while sum(1 for _ in got) < sum(ends.values()) and time.time() < deadline:
        t = consumer.poll(timeout_ms=500)
        if t is not None and t.num_rows:
            got.extend(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                           t.column("value").to_pylist()))
    return sorted(got)


def _acls(zk_connect, monkeypatch, setup, *args):
    from replikafka.cli.main import main
    monkeypatch.setenv("REPLIKAFKA_ZK_DIGEST", ":".join(setup.zk_digest))
    assert main(["acls", "--zookeeper", zk_connect, *args]) == 0


def test_every_rpc_refuses_unauthenticated_and_unauthorized_callers(secure, zk_connect, kazoo_factory,
                                                                    monkeypatch):
    setup, cluster = secure
    with _client(Admin, cluster, setup, "admin", "SSL") as admin:
        admin.create_topic(TOPIC, partitions=2, replication_factor=2)
    with _client(Producer, cluster, setup, "admin", "SASL_SSL") as producer:
        for i in range(4):
            producer.send(TOPIC, kafka_batch([f"v{i}-{j}".encode() for j in range(50)]), partition=i % 2).result()
    with _client(Consumer, cluster, setup, "admin", "SSL") as consumer:
        acked = _read_all(consumer, 2)
    assert len(acked) == 200
    zk = kazoo_factory()
    wait_until(lambda: all(len(zk.get_children(f"/brokers/topics/{TOPIC}/partitions")) == 2 for _ in [0]))
    before = _state(cluster, zk)

    # ---- unauthenticated: refused with the cause named, before any handler runs
    with pytest.raises(E.SslAuthenticationError, match="speaks TLS but security.protocol is PLAINTEXT"):
        Admin({"bootstrap.servers": cluster.bootstrap_for("SSL"), "request.timeout.ms": 3000}).list_topics()
    no_cert = {"security.protocol": "SSL", "ssl.ca.location": setup.ca.ca_path}
    with pytest.raises(E.SslAuthenticationError, match="requires a client certificate"):
        Admin({"bootstrap.servers": cluster.bootstrap_for("SSL"), **no_cert, "request.timeout.ms": 3000}).list_topics()
    with pytest.raises(E.SaslAuthenticationFailedError, match="needs a username and password"):
        Admin({"bootstrap.servers": cluster.bootstrap_for("SASL_SSL"), **no_cert,
               "request.timeout.ms": 3000}).list_topics()
    wrong = {**setup.client_config("alice", "SASL_SSL"), "sasl.password": "guess"}
    with pytest.raises(E.SaslAuthenticationFailedError, match="user 'alice'.*wrong password"):
        Admin({"bootstrap.servers": cluster.bootstrap_for("SASL_SSL"), **wrong, "request.timeout.ms": 3000}).list_topics()
    wrong_pool = ConnectionPool(security=wrong)
    target = cluster.bootstrap_for("SASL_SSL").split(",")[0]
    for method, request in [("Produce", pb.ProduceRequest(acks=-1)),
                            ("StopReplica", pb.StopReplicaRequest(controller_epoch=99, delete_partitions=True))]:
        with pytest.raises(E.SaslAuthenticationFailedError):
            wrong_pool.call(target, method, request, 5)
    assert wrong_pool.call(target, "DeleteTopic", pb.DeleteTopicRequest(name=TOPIC), 5).error.code == \
        "SASL_AUTHENTICATION_FAILED"
    wrong_pool.close()

    # ---- authenticated but without ACLs (alice over SASL_SSL, bob over mTLS): every RPC refused
    for user, protocol in (("alice", "SASL_SSL"), ("bob", "SSL")):
        principal = f"User:{user}"
        with _client(Admin, cluster, setup, user, protocol) as a:
            assert a.list_topics() == []          # metadata lists only Describe-able topics
            with pytest.raises(E.TopicAuthorizationFailedError, match=f"{principal} .*Create on Topic 'new'"):
                a.create_topic("new", partitions=1, replication_factor=1)
            with pytest.raises(E.TopicAuthorizationFailedError, match="Delete on Topic 'orders'"):
                a.delete_topic(TOPIC)
            with pytest.raises(E.TopicAuthorizationFailedError, match="Alter on Topic 'orders'"):
                a.create_partitions(TOPIC, 4)
        with _client(Producer, cluster, setup, user, protocol, **{"enable.idempotence": "false"}) as p:
            with pytest.raises((E.TopicAuthorizationFailedError, E.KafkaTimeoutError)):
                p.send(TOPIC, kafka_batch([b"forged"]), partition=0).result()
        pool = ConnectionPool(security=setup.client_config(user, protocol))
        tgt = cluster.bootstrap_for(protocol).split(",")[0]
        named = pool.call(tgt, "Metadata", pb.MetadataRequest(topics=[TOPIC]), 5)
        assert [t.error.code for t in named.topics] == ["TOPIC_AUTHORIZATION_FAILED"]
        topic_calls = [
            ("Produce", pb.ProduceRequest(acks=-1, partitions=[pb.PartitionProduceData(topic=TOPIC, partition=0)])),
            ("Fetch", pb.FetchRequest(replica_id=-1, max_bytes=1 << 20, partitions=[
                pb.FetchPartition(topic=TOPIC, partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])),
            ("ListOffsets", pb.ListOffsetsRequest(partitions=[
                pb.ListOffsetsPartition(topic=TOPIC, partition=0, timestamp_ms=-1)])),
        ]
        for method, request in topic_calls:
            with pytest.raises(E.TopicAuthorizationFailedError, match=f"{principal}.*on Topic 'orders'"):
                pool.call(tgt, method, request, 5)
        for method, request in [("CreateTopic", pb.CreateTopicRequest(name="x", partitions=1, replication_factor=1)),
                                ("DeleteTopic", pb.DeleteTopicRequest(name=TOPIC)),
                                ("CreatePartitions", pb.CreatePartitionsRequest(name=TOPIC, total_count=5))]:
            assert pool.call(tgt, method, request, 5).error.code == "TOPIC_AUTHORIZATION_FAILED"
        # forged controller / follower requests that would change state if obeyed
        forged = [
            ("LeaderAndIsr", pb.LeaderAndIsrRequest(controller_id=2, controller_epoch=1000, partitions=[
                pb.PartitionState(topic=TOPIC, partition=0, controller_epoch=1000, leader=-1, leader_epoch=1000,
                                  isr=[], replicas=[1, 2])])),
            ("StopReplica", pb.StopReplicaRequest(controller_id=2, controller_epoch=1000, delete_partitions=True,
                                                  partitions=[pb.TopicPartitionRef(topic=TOPIC, partition=0),
                                                              pb.TopicPartitionRef(topic=TOPIC, partition=1)])),
            ("UpdateMetadata", pb.UpdateMetadataRequest(controller_id=2, controller_epoch=1000, full=True)),
            ("Fetch", pb.FetchRequest(replica_id=2, max_bytes=1 << 20, partitions=[
                pb.FetchPartition(topic=TOPIC, partition=0, fetch_offset=10 ** 6, partition_max_bytes=1 << 20)])),
            ("OffsetsForLeaderEpoch", pb.OffsetsForLeaderEpochRequest(replica_id=2, partitions=[
                pb.EpochQuery(topic=TOPIC, partition=0, leader_epoch=0)])),
            ("InitProducerId", pb.InitProducerIdRequest()),
        ]
        for method, request in forged:
            with pytest.raises(E.ClusterAuthorizationFailedError, match=f"{principal}.*on Cluster"):
                pool.call(tgt, method, request, 5)
        shutdown = pool.call(tgt, "ControlledShutdown", pb.ControlledShutdownRequest(broker_id=1, broker_epoch=0), 5)
        assert shutdown.error.code == "CLUSTER_AUTHORIZATION_FAILED"
        from replikafka.broker import replica_fetch_codec
        with pytest.raises(E.ClusterAuthorizationFailedError):
            pool.call_bytes(tgt, replica_fetch_codec.PATH, forged[3][1].SerializeToString(),
                            replica_fetch_codec.decode, 5)
        pool.close()

    # ---- Flight calls: unauthenticated and unauthorized callers refused too
    flight_calls(cluster, setup, before_acls=True)

    # ---- anonymous ZooKeeper clients cannot change the cluster's znodes
    for path in (f"/brokers/topics/{TOPIC}", "/controller", "/controller_epoch"):
        with pytest.raises(NoAuthError):
            zk.set(path, b"forged")
    for path in ("/brokers/ids/9", f"/admin/delete_topics/{TOPIC}", "/kafka-acl/Topic/orders"):
        with pytest.raises(NoAuthError):
            zk.create(path, b"forged", makepath=False)
    with pytest.raises(NoAuthError):
        zk.delete("/controller")

    # ---- nothing changed: znodes, data files, acknowledged records; both brokers serve
    time.sleep(1.0)
    assert _state(cluster, zk) == before
    assert all(cluster.alive(b) for b in cluster.ids)
    with _client(Consumer, cluster, setup, "admin", "SASL_SSL") as consumer:
        assert _read_all(consumer, 2) == acked

    # ---- ACLs added and removed take effect live (through the brokers' watch)
    _acls(zk_connect, monkeypatch, setup, "--add", "--allow-principal", "User:alice", "--operation", "Write",
          "--operation", "Read", "--topic", "ord", "--resource-pattern-type", "prefixed")
    started = time.monotonic()
    with _client(Producer, cluster, setup, "alice", "SASL_SSL", **{"enable.idempotence": "false"}) as p:
        wait_until(lambda: _try(lambda: p.send(TOPIC, kafka_batch([b"alice"]), partition=0).result(timeout=5)),
                   timeout_s=5, what="alice's write allowed")
    assert time.monotonic() - started < 5
    with _client(Consumer, cluster, setup, "alice", "SASL_SSL") as c:
        assert (0, 100, b"alice") in _read_all(c, 2)
    with _client(Admin, cluster, setup, "alice", "SASL_SSL") as a:
        assert a.list_topics() == [TOPIC]       # Read implies Describe
    flight_calls(cluster, setup, before_acls=False)
    _acls(zk_connect, monkeypatch, setup, "--remove", "--allow-principal", "User:alice", "--operation", "Write",
          "--topic", "ord", "--resource-pattern-type", "prefixed")
    pool = ConnectionPool(security=setup.client_config("alice", "SASL_SSL"))
    wait_until(lambda: _refused(pool, cluster), timeout_s=3, what="alice's write refused again")
    pool.close()


def _flight(cluster, setup, cfg):
    """A pyarrow Flight client to broker 1's Flight listener with ``cfg``'s TLS and credentials."""
    import pyarrow.flight as fl
    from replikafka.security.tls import ClientSecurity
    with _client(Admin, cluster, setup, "admin", "SSL") as admin:
        admin.list_topics()
        address = next(b.listener("FLIGHT") for b in admin._metadata.brokers() if b.id == cluster.ids[0])
    sec = ClientSecurity.from_config(cfg)
    opts = sec.flight_client_options()
    client = fl.FlightClient(f"{opts.pop('scheme')}://{address}", **opts)
    return client, fl.FlightCallOptions(headers=sec.flight_headers(), timeout=10)


def flight_calls(cluster, setup, before_acls: bool):
    """DoGet, DoPut, GetFlightInfo, GetSchema, ListFlights as anonymous, with a wrong password
    and as alice; admin's GetFlightInfo gives the real tickets. Before alice's ACLs every one
    is refused; after them alice reads and appends."""
    import pyarrow.flight as fl
    from replikafka import records as R
    from replikafka.broker.storage.batch_format import body_crc32c
    from replikafka.protocol.flight_produce import Append, ProduceCommand
    stored = R.stored_schema(R.KAFKA_SCHEMA)
    put_batch = flight_batch([b"flight-put"])
    put_command = ProduceCommand(TOPIC, 0, 1, 10_000, (Append(-1, tuple(body_crc32c([put_batch], stored))),)).encode()
    descriptor = fl.FlightDescriptor.for_path(TOPIC)
    admin, admin_opts = _flight(cluster, setup, setup.client_config("admin", "SASL_SSL"))
    info = admin.get_flight_info(descriptor, admin_opts)
    tickets = [e.ticket for e in info.endpoints]
    anonymous = _flight(cluster, setup, {"security.protocol": "SSL", "ssl.ca.location": setup.ca.ca_path,
                                         **{k: v for k, v in setup.client_config("bob", "SSL").items()
                                            if k.startswith("ssl.")}})
    wrong = _flight(cluster, setup, {**setup.client_config("alice", "SASL_SSL"), "sasl.password": "guess"})
    alice = _flight(cluster, setup, setup.client_config("alice", "SASL_SSL"))
    with pytest.raises(fl.FlightUnauthenticatedError, match="SASL_AUTHENTICATION_FAILED"):
        wrong[0].get_flight_info(descriptor, wrong[1])
    with pytest.raises(fl.FlightUnauthenticatedError, match="SASL_AUTHENTICATION_FAILED"):
        flight_put(wrong[0], put_command, [put_batch], stored, wrong[1])
    for client, opts in ([anonymous, alice] if before_acls else [anonymous]):
        with pytest.raises(fl.FlightUnauthorizedError, match="TOPIC_AUTHORIZATION_FAILED.*Describe on Topic 'orders'"):
            client.get_flight_info(descriptor, opts)
        import pyarrow as pa   # pyarrow reports GetSchema's refusal as a plain ArrowException
        with pytest.raises((fl.FlightUnauthorizedError, pa.ArrowException), match="TOPIC_AUTHORIZATION_FAILED"):
            client.get_schema(descriptor, opts)
        assert [f.descriptor.path for f in client.list_flights(options=opts)] == []
        for ticket in tickets:
            with pytest.raises(fl.FlightUnauthorizedError, match="Read on Topic 'orders'"):
                client.do_get(ticket, opts).read_all()
        with pytest.raises(fl.FlightUnauthorizedError, match="Write on Topic 'orders'"):
            flight_put(client, put_command, [put_batch], stored, opts)
    if not before_acls:
        client, opts = alice
        assert client.get_flight_info(descriptor, opts).descriptor.path == [TOPIC.encode()]
        rows = 0
        for e in client.get_flight_info(descriptor, opts).endpoints:
            loc = e.locations[0].uri.decode() if e.locations else None
            reader = fl.FlightClient(loc, **_flight_tls(setup)) if loc else client   # read at the leader
            rows += reader.do_get(e.ticket, opts).read_all().num_rows
        assert rows >= 201
        leader_of_0 = info.endpoints[0].locations[0].uri.decode()    # the endpoints are in partition order
        writer = fl.FlightClient(leader_of_0, **_flight_tls(setup))
        (answer,) = json.loads(flight_put(writer, put_command, [put_batch], stored, opts))["results"]
        assert answer["record_count"] == 1 and answer["base_offset"] >= 101


def _flight_tls(setup):
    from replikafka.security.tls import ClientSecurity
    opts = ClientSecurity.from_config(setup.client_config("alice", "SASL_SSL")).flight_client_options()
    opts.pop("scheme")
    return opts


def _try(fn):
    try:
        fn()
        return True
    except E.TopicAuthorizationFailedError:
        return False


def _refused(pool, cluster):
    leader_target = cluster.bootstrap_for("SASL_SSL").split(",")
    try:
        for t in leader_target:
            pool.call(t, "Produce", pb.ProduceRequest(acks=1, partitions=[
                pb.PartitionProduceData(topic=TOPIC, partition=0)]), 5)
    except E.TopicAuthorizationFailedError:
        return True
    except E.ReplikafkaError:
        return False
    return False


def test_bad_certificates_are_refused_with_the_cause(secure, tmp_path):
    setup, cluster = secure
    ssl_bootstrap = cluster.bootstrap_for("SSL")
    other = CertificateAuthority(str(tmp_path / "other-ca"), name="some-other-ca")
    mallory = other.issue("admin")   # claims to be admin, signed by the wrong CA
    # the client does not trust the broker's CA
    cfg = {**setup.client_config("admin", "SSL"), "ssl.ca.location": other.ca_path}
    with pytest.raises(E.SslAuthenticationError, match="not signed by the CA in ssl.ca.location"):
        Admin({"bootstrap.servers": ssl_bootstrap, **cfg, "request.timeout.ms": 3000}).list_topics()
    # the broker does not trust the client's CA
    cfg = {"security.protocol": "SSL", "ssl.ca.location": setup.ca.ca_path,
           "ssl.certificate.location": mallory.certificate, "ssl.key.location": mallory.key}
    with pytest.raises(E.SslAuthenticationError, match="does not trust our client certificate"):
        Admin({"bootstrap.servers": ssl_bootstrap, **cfg, "request.timeout.ms": 3000}).list_topics()
    # an expired client certificate
    expired = setup.ca.issue("alice", expired=True, file_stem="alice-expired")
    cfg = {"security.protocol": "SSL", "ssl.ca.location": setup.ca.ca_path,
           "ssl.certificate.location": expired.certificate, "ssl.key.location": expired.key}
    with pytest.raises(E.SslAuthenticationError, match="certificate expired on"):
        Admin({"bootstrap.servers": ssl_bootstrap, **cfg})
    # a plaintext client on a TLS port, and a TLS client on a port that is not TLS
    with pytest.raises(E.SslAuthenticationError, match="speaks TLS"):
        Producer({"bootstrap.servers": ssl_bootstrap, "request.timeout.ms": 3000}).send(
            TOPIC, kafka_batch([b"x"])).result()
    with pytest.raises(E.SslAuthenticationError, match="does not speak TLS"):
        Admin({"bootstrap.servers": cluster.zookeeper_connect.split("/")[0], **setup.client_config("admin", "SSL"),
               "request.timeout.ms": 3000}).list_topics()
    # the cluster is unaffected
    with _client(Admin, cluster, setup, "admin", "SSL") as admin:
        admin.create_topic("after", partitions=1, replication_factor=2)
        assert "after" in admin.list_topics()
