"""What each RPC needs (broker/security.py), decided against a fixed ACL snapshot:
every RPC of the seam's table has a rule, and the rule is the one Kafka applies."""
import pytest

from replikafka import errors as E
from replikafka.broker.config import BrokerConfig
from replikafka.broker.rpc_server import RPC_SPECS, RequestContext
from replikafka.broker.security import Authorizer, BrokerSecurity
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.security import acl as A


class _Fixed:
    def __init__(self, snapshot):
        self.snapshot = snapshot


def _security(*acls, super_users=""):
    sec = BrokerSecurity(BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "h:1",
                                                 "authorizer.class.name": "AclAuthorizer",
                                                 "super.users": super_users}))
    snap = A.AclSnapshot()
    for pattern, entry in acls:
        snap = snap.with_pattern(pattern, set(snap.acls.get(pattern, ())) | {entry})
    sec.authorizer = Authorizer(sec.authorizer_config, _Fixed(snap))
    return sec


TOPIC = A.ResourcePattern("Topic", "t")
REQUESTS = {
    "Produce": pb.ProduceRequest(partitions=[pb.PartitionProduceData(topic="t")]),
    "Fetch": pb.FetchRequest(replica_id=-1, partitions=[pb.FetchPartition(topic="t")]),
    "ListOffsets": pb.ListOffsetsRequest(partitions=[pb.ListOffsetsPartition(topic="t")]),
    "CreateTopic": pb.CreateTopicRequest(name="t"),
    "DeleteTopic": pb.DeleteTopicRequest(name="t"),
    "CreatePartitions": pb.CreatePartitionsRequest(name="t"),
    "AlterConfigs": pb.AlterConfigsRequest(resource_type="topics", name="t"),
    "DescribeConfigs": pb.DescribeConfigsRequest(resource_type="topics", name="t"),
}
# RPC -> (operation, resource type) Kafka requires
EXPECTED = {"Produce": ("Write", "Topic"), "Fetch": ("Read", "Topic"), "ListOffsets": ("Read", "Topic"),
            "CreateTopic": ("Create", "Topic"), "DeleteTopic": ("Delete", "Topic"),
            "CreatePartitions": ("Alter", "Topic"), "InitProducerId": ("IdempotentWrite", "Cluster"),
            "AlterConfigs": ("AlterConfigs", "Topic"), "DescribeConfigs": ("DescribeConfigs", "Topic"),
            "AlterPartitionReassignments": ("Alter", "Cluster"), "ElectLeaders": ("Alter", "Cluster"),
            "Metadata": (None, None)}


def _ctx(sec, method, principal="User:alice"):
    return RequestContext(method, "SASL_SSL", "ipv4:10.0.0.1:5000", principal, None, sec)


@pytest.mark.parametrize("name", sorted(RPC_SPECS))
def test_every_rpc_needs_exactly_its_operation(name):
    spec = RPC_SPECS[name]
    op, rtype = EXPECTED.get(name, ("ClusterAction", "Cluster"))
    request = REQUESTS.get(name, spec.request())
    nobody = _security()
    if op is None:
        nobody.authorize(_ctx(nobody, name), spec, request)   # decided in the handler
        return
    refused = E.TopicAuthorizationFailedError if rtype == "Topic" else E.ClusterAuthorizationFailedError
    with pytest.raises(refused, match=f"User:alice \\(host 10.0.0.1\\) is not allowed {op}"):
        nobody.authorize(_ctx(nobody, name), spec, request)
    pattern = TOPIC if rtype == "Topic" else A.CLUSTER
    granted = _security((pattern, A.AclEntry("User:alice", "*", op, "Allow")))
    granted.authorize(_ctx(granted, name), spec, request)
    others = [o for o in ("Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction",
                          "DescribeConfigs", "AlterConfigs") if o != op and not (op == "DescribeConfigs" and o == "AlterConfigs")]
    wrong = _security(*[(pattern, A.AclEntry("User:alice", "*", o, "Allow")) for o in others])
    if op != "IdempotentWrite":   # (Write on a topic also allows an idempotent producer)
        with pytest.raises(refused):
            wrong.authorize(_ctx(wrong, name), spec, request)


def test_a_follower_fetch_is_cluster_action_and_super_users_pass():
    sec = _security((TOPIC, A.AclEntry("User:alice", "*", "All", "Allow")), super_users="User:broker")
    follower = pb.FetchRequest(replica_id=2, partitions=[pb.FetchPartition(topic="t")])
    with pytest.raises(E.ClusterAuthorizationFailedError, match="ClusterAction on Cluster 'kafka-cluster'"):
        sec.authorize(_ctx(sec, "Fetch"), RPC_SPECS["Fetch"], follower)
    sec.authorize(_ctx(sec, "Fetch", "User:broker"), RPC_SPECS["Fetch"], follower)


def test_create_on_the_cluster_covers_new_topics():
    sec = _security((A.CLUSTER, A.AclEntry("User:alice", "*", "Create", "Allow")))
    sec.authorize(_ctx(sec, "CreateTopic"), RPC_SPECS["CreateTopic"], pb.CreateTopicRequest(name="anything"))
