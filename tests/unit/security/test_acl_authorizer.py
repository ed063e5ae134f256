"""The pure ACL decision core: Kafka's AclAuthorizer rules."""
import pytest

from replikafka import errors as E
from replikafka.security import acl as A

ALICE, BOB = "User:alice", "User:bob"


def snap(*items):
    """items: (pattern, principal, host, op, perm)"""
    s = A.AclSnapshot()
    for pattern, principal, host, op, perm in items:
        s = s.with_pattern(pattern, set(s.acls.get(pattern, ())) | {A.AclEntry(principal, host, op, perm)})
    return s


def topic(name, ptype="literal"):
    return A.ResourcePattern("Topic", name, ptype)


CFG = A.AuthorizerConfig()


def allowed(s, principal, op, name, host="10.0.0.1", rtype="Topic", cfg=CFG):
    return A.authorize(s, cfg, principal, host, op, rtype, name)


def test_literal_allow_only_that_topic_and_operation():
    s = snap((topic("orders"), ALICE, "*", "Read", "Allow"))
    assert allowed(s, ALICE, "Read", "orders")
    assert not allowed(s, ALICE, "Write", "orders")
    assert not allowed(s, BOB, "Read", "orders")
    assert not allowed(s, ALICE, "Read", "orders2")      # no ACL at all -> allow.everyone.if.no.acl.found=false


def test_no_acl_found_follows_config():
    s = A.AclSnapshot()
    assert not allowed(s, ALICE, "Read", "t")
    assert allowed(s, ALICE, "Read", "t", cfg=A.AuthorizerConfig(allow_everyone_if_no_acl_found=True))
    # but a resource that has ACLs is decided by them, not by the flag
    s = snap((topic("t"), BOB, "*", "Read", "Allow"))
    assert not allowed(s, ALICE, "Read", "t", cfg=A.AuthorizerConfig(allow_everyone_if_no_acl_found=True))


def test_prefixed_and_wildcard_patterns():
    s = snap((topic("sales-", "prefixed"), ALICE, "*", "Write", "Allow"),
             (topic("*"), BOB, "*", "Read", "Allow"))
    assert allowed(s, ALICE, "Write", "sales-eu")
    assert not allowed(s, ALICE, "Write", "sale")
    assert allowed(s, BOB, "Read", "anything")
    assert allowed(s, BOB, "Read", "sales-eu")


def test_deny_wins_over_allow_from_any_pattern():
    s = snap((topic("*"), ALICE, "*", "All", "Allow"),
             (topic("secret-", "prefixed"), ALICE, "*", "Read", "Deny"))
    assert allowed(s, ALICE, "Read", "public")
    assert not allowed(s, ALICE, "Read", "secret-x")
    assert allowed(s, ALICE, "Write", "secret-x")        # deny of Read only


def test_host_and_principal_wildcards():
    s = snap((topic("t"), "User:*", "10.0.0.1", "Read", "Allow"))
    assert allowed(s, ALICE, "Read", "t", host="10.0.0.1")
    assert not allowed(s, ALICE, "Read", "t", host="10.0.0.2")


def test_describe_is_implied_by_read_write_but_not_by_create():
    s = snap((topic("a"), ALICE, "*", "Write", "Allow"), (topic("b"), ALICE, "*", "Create", "Allow"))
    assert allowed(s, ALICE, "Describe", "a")
    assert not allowed(s, ALICE, "Describe", "b")
    # a deny of Describe is not implied by a deny of Read
    s = snap((topic("c"), ALICE, "*", "All", "Allow"), (topic("c"), ALICE, "*", "Read", "Deny"))
    assert allowed(s, ALICE, "Describe", "c")


def test_super_users_bypass_everything_including_deny():
    s = snap((A.CLUSTER, ALICE, "*", "ClusterAction", "Deny"))
    cfg = A.AuthorizerConfig(super_users=A.AuthorizerConfig.parse_super_users("User:broker; User:admin"))
    assert allowed(s, "User:broker", "ClusterAction", A.CLUSTER_NAME, rtype="Cluster", cfg=cfg)
    assert not allowed(s, ALICE, "ClusterAction", A.CLUSTER_NAME, rtype="Cluster", cfg=cfg)


def test_cluster_action_needs_its_own_acl():
    s = snap((A.CLUSTER, ALICE, "*", "Alter", "Allow"))
    assert not allowed(s, ALICE, "ClusterAction", A.CLUSTER_NAME, rtype="Cluster")


def test_authorize_any_for_idempotent_producers():
    s = snap((topic("t"), ALICE, "*", "Write", "Allow"), (topic("t"), BOB, "*", "Write", "Allow"),
             (topic("t"), BOB, "*", "Write", "Deny"))
    assert A.authorize_any(s, CFG, ALICE, "h", "Write", "Topic")
    assert not A.authorize_any(s, CFG, BOB, "h", "Write", "Topic")
    assert not A.authorize_any(s, CFG, "User:carol", "h", "Write", "Topic")


def test_json_round_trip_and_validation():
    entries = {A.AclEntry(ALICE, "*", "Read", "Allow"), A.AclEntry(BOB, "1.2.3.4", "All", "Deny")}
    assert A.acls_from_json(A.acls_to_json(entries)) == entries
    with pytest.raises(E.InvalidConfigError, match="operation 'Fly'"):
        A.AclEntry(ALICE, "*", "Fly", "Allow")
    with pytest.raises(E.InvalidConfigError, match="principal 'alice'"):
        A.AclEntry("alice", "*", "Read", "Allow")
    with pytest.raises(E.InvalidConfigError, match="cluster resource"):
        A.ResourcePattern("Cluster", "other")
    assert A.operation_name("cluster_action") == "ClusterAction"
    assert A.operation_name("READ") == "Read"
