"""Security state in a real ZooKeeper (the embedded `replikafka zookeeper`):
digest-authenticated writers, znode ACLs that refuse anonymous writes, the ACL
and SCRAM stores, and the broker caches kept current by watches."""
import time

import pytest
from kazoo.exceptions import NoAuthError

from replikafka.security import acl as A
from replikafka.security import scram
from replikafka.security import zk_security as Z

pytestmark = pytest.mark.integration


def _wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_anonymous_clients_cannot_change_broker_znodes(kazoo_factory):
    broker = kazoo_factory(**Z.kazoo_security("kafka", "broker-secret", set_acl=True))
    Z.secure_existing(broker, "kafka", "broker-secret", ("/",))   # the chroot itself (brokers do this at start)
    for path in ("/brokers/ids", "/brokers/topics/t", "/controller_epoch", "/admin/delete_topics"):
        broker.ensure_path(path)
    broker.create("/controller", b'{"brokerid":1}', ephemeral=True)
    store = Z.AclStore(broker)
    store.ensure_paths()
    store.change(A.ResourcePattern("Topic", "t"), add=frozenset({A.AclEntry("User:a", "*", "Read", "Allow")}))
    Z.CredentialStore(broker, Z.sensitive_acl("kafka", "broker-secret")).alter(
        "alice", {"SCRAM-SHA-256": scram.make_credential("SCRAM-SHA-256", "pw")})

    anonymous = kazoo_factory()
    wrong = kazoo_factory(auth_data=[("digest", "kafka:guess")])
    for client in (anonymous, wrong):
        # world-readable where Kafka's are
        assert client.get("/brokers/topics/t")[0] == b""
        assert A.acls_from_json(client.get("/kafka-acl/Topic/t")[0])
        for path in ("/brokers/topics/t", "/controller", "/controller_epoch", "/kafka-acl/Topic/t"):
            with pytest.raises(NoAuthError):
                client.set(path, b"forged")
        for path in ("/brokers/ids/9", "/admin/delete_topics/t", "/kafka-acl/Topic/x", "/kafka-acl-changes/c"):
            with pytest.raises(NoAuthError):
                client.create(path, b"forged")
        with pytest.raises(NoAuthError):
            client.delete("/controller")
        with pytest.raises(NoAuthError):   # SCRAM credentials are not even readable
            client.get("/config/users/alice")
    assert broker.get("/controller")[0] == b'{"brokerid":1}'
    assert Z.CredentialStore(broker).get("alice")["SCRAM-SHA-256"]


def test_secure_existing_roots_of_an_open_cluster(kazoo_factory):
    open_client = kazoo_factory()
    open_client.ensure_path("/brokers/topics")
    broker = kazoo_factory(**Z.kazoo_security("kafka", "s", set_acl=True))
    Z.secure_existing(broker, "kafka", "s", ("/brokers/topics",))
    with pytest.raises(NoAuthError):
        open_client.create("/brokers/topics/forged", b"")


def test_acl_cache_sees_add_and_remove_within_a_second(kazoo_factory):
    writer, reader = kazoo_factory(), kazoo_factory()
    cache = Z.AclCache(reader)
    cache.start()
    t = A.ResourcePattern("Topic", "orders-", "prefixed")
    entry = A.AclEntry("User:alice", "*", "Write", "Allow")
    cfg = A.AuthorizerConfig()
    Z.AclStore(writer).change(t, add=frozenset({entry}))
    assert _wait(lambda: A.authorize(cache.snapshot, cfg, "User:alice", "h", "Write", "Topic", "orders-1"), 1.0)
    Z.AclStore(writer).change(t, remove=frozenset({entry}))
    assert _wait(lambda: not A.authorize(cache.snapshot, cfg, "User:alice", "h", "Write", "Topic", "orders-1"), 1.0)
    assert not writer.exists(Z.pattern_path(t))


def test_credential_cache_follows_password_changes(kazoo_factory):
    writer, reader = kazoo_factory(), kazoo_factory()
    store, cache = Z.CredentialStore(writer), Z.CredentialCache(reader)
    cache.start()
    assert not cache.verify("PLAIN", "bob", "one")
    for i in range(50):   # names nobody created get no watch
        assert not cache.verify("PLAIN", f"made-up-{i}", "x")
    assert not cache._watched
    store.alter("bob", {"SCRAM-SHA-512": scram.make_credential("SCRAM-SHA-512", "one")})
    assert _wait(lambda: cache.verify("PLAIN", "bob", "one"))
    assert cache.verify("SCRAM-SHA-512", "bob", "one") and not cache.verify("SCRAM-SHA-256", "bob", "one")
    store.alter("bob", {"SCRAM-SHA-512": scram.make_credential("SCRAM-SHA-512", "two")})
    assert _wait(lambda: not cache.verify("PLAIN", "bob", "one"))
    assert cache.verify("PLAIN", "bob", "two")
    raw = writer.get("/config/users/bob")[0]
    assert b"two" not in raw and b"stored_key" in raw


def test_acls_and_configs_cli(zk_connect, kazoo_factory, capsys, monkeypatch):
    from replikafka.cli.main import main
    from replikafka.security.zk_security import AclStore, CredentialStore

    assert main(["acls", "--authorizer-properties", f"zookeeper.connect={zk_connect}", "--add",
                 "--allow-principal", "User:alice", "--operation", "Read", "--operation", "Describe",
                 "--topic", "sales-", "--resource-pattern-type", "prefixed"]) == 0
    assert main(["acls", "--zookeeper", zk_connect, "--add", "--deny-principal", "User:bob",
                 "--deny-host", "10.1.1.1", "--operation", "Write", "--topic", "orders"]) == 0
    snap = AclStore(kazoo_factory()).snapshot()
    cfg = A.AuthorizerConfig()
    assert A.authorize(snap, cfg, "User:alice", "h", "Read", "Topic", "sales-eu")
    assert not A.authorize(snap, cfg, "User:alice", "h", "Write", "Topic", "sales-eu")
    capsys.readouterr()
    assert main(["acls", "--zookeeper", zk_connect, "--list", "--topic", "sales-eu",
                 "--resource-pattern-type", "match"]) == 0
    out = capsys.readouterr().out
    assert "name=sales-, patternType=PREFIXED" in out and "operation=READ" in out and "bob" not in out
    assert main(["acls", "--zookeeper", zk_connect, "--remove", "--allow-principal", "User:alice",
                 "--operation", "Read", "--topic", "sales-", "--resource-pattern-type", "prefixed"]) == 0
    snap = AclStore(kazoo_factory()).snapshot()
    assert not A.authorize(snap, cfg, "User:alice", "h", "Read", "Topic", "sales-eu")
    assert A.authorize(snap, cfg, "User:alice", "h", "Describe", "Topic", "sales-eu")
    # bad flags: one line naming the problem
    assert main(["acls", "--zookeeper", zk_connect, "--add", "--allow-principal", "alice", "--topic", "t"]) == 1
    assert "principal 'alice' is not 'Type:name'" in capsys.readouterr().err
    assert main(["acls", "--zookeeper", zk_connect, "--add", "--allow-principal", "User:a",
                 "--operation", "ClusterAction", "--topic", "t"]) == 1
    assert "applies to --cluster" in capsys.readouterr().err

    assert main(["configs", "--zookeeper", zk_connect, "--entity-type", "users", "--entity-name", "carol",
                 "--alter", "--add-config", "SCRAM-SHA-256=[iterations=8192,password=carol-pw]"]) == 0
    creds = CredentialStore(kazoo_factory()).get("carol")
    assert creds["SCRAM-SHA-256"].iterations == 8192 and scram.verify("SCRAM-SHA-256", creds["SCRAM-SHA-256"], "carol-pw")
    capsys.readouterr()
    assert main(["configs", "--zookeeper", zk_connect, "--entity-type", "users", "--describe"]) == 0
    out = capsys.readouterr().out
    assert "carol" in out and "SCRAM-SHA-256=iterations=8192" in out and "carol-pw" not in out


def test_cli_writes_need_the_broker_identity_when_zookeeper_is_secured(zk_connect, kazoo_factory, capsys,
                                                                       monkeypatch):
    from replikafka.cli.main import main
    broker = kazoo_factory(**Z.kazoo_security("kafka", "zk-pw", set_acl=True))
    Z.secure_existing(broker, "kafka", "zk-pw", ("/",))
    Z.AclStore(broker).ensure_paths()
    args = ["acls", "--zookeeper", zk_connect, "--add", "--allow-principal", "User:x", "--operation", "Read",
            "--topic", "t"]
    assert main(args) == 1
    assert "REPLIKAFKA_ZK_DIGEST" in capsys.readouterr().err
    assert not broker.exists("/kafka-acl/Topic/t")
    monkeypatch.setenv("REPLIKAFKA_ZK_DIGEST", "kafka:zk-pw")
    assert main(args) == 0
    assert broker.exists("/kafka-acl/Topic/t")
