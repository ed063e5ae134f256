"""A broker's security: TLS on its listeners, who each caller is, what they may do.

:class:`BrokerSecurity` is built from the broker config and plugs into the RPC
pipeline (``broker/rpc_server.py``) as its ``RequestGate``:

- ``authenticate``: PLAINTEXT -> ``User:ANONYMOUS``; SSL -> ``User:<name>`` from
  the verified client certificate through ``ssl.principal.mapping.rules``
  (``User:ANONYMOUS`` when ``ssl.client.auth=none``); SASL_SSL -> ``User:<username>``
  after the password given with the call (over TLS) matched the salted SCRAM
  credential in ZooKeeper (a wrong one fails the call with SASL_AUTHENTICATION_FAILED).
- ``authorize``: with ``authorizer.class.name`` set, every call needs the ACL
  of :data:`TOPIC_OPERATIONS` on each topic it names, or ClusterAction on the
  cluster for controller-to-broker and broker-to-broker requests (LeaderAndIsr,
  UpdateMetadata, StopReplica, ControlledShutdown, follower fetches,
  OffsetsForLeaderEpoch). A refusal raises before the handler runs: nothing changes.
- Metadata lists only the topics the caller may Describe (the handler asks
  ``RequestContext.allowed``).

Decisions are memoized per ACL snapshot (bounded); a new snapshot (a watch
fired) starts an empty memo, so an ACL change is live at once. Thread-safe:
snapshots are immutable and swapped whole.
"""
from __future__ import annotations

import logging
import threading

import grpc

from replikafka import errors as E
from replikafka.broker.rpc_server import RateLimitedLog
from replikafka.security import acl as A
from replikafka.security import tls
from replikafka.security.zk_security import (ACL_CHANGES, ACL_ROOT, CONFIG_USERS, AclCache, CredentialCache,
                                                 kazoo_security, secure_existing, sensitive_acl)

log = logging.getLogger("replikafka.security")

ANONYMOUS = A.ANONYMOUS
CLUSTER = ("Cluster", A.CLUSTER_NAME)
# RPC -> the operation it needs on each topic it names.
TOPIC_OPERATIONS = {"Produce": "Write", "Fetch": "Read", "ListOffsets": "Read",
                    "CreateTopic": "Create", "DeleteTopic": "Delete", "CreatePartitions": "Alter",
                    "AlterConfigs": "AlterConfigs", "DescribeConfigs": "DescribeConfigs"}
# RPC -> the operation it needs on the cluster (Kafka: reassignments and leader elections are Alter on
# the cluster; an idempotent producer IdempotentWrite, or Write on some topic).
CLUSTER_OPERATIONS = {"InitProducerId": "IdempotentWrite", "AlterPartitionReassignments": "Alter",
                      "ElectLeaders": "Alter"}
# RPCs whose handler asks per item (RequestContext.allowed) instead of refusing the call.
HANDLER_DECIDES = ("Metadata",)
DECISIONS_MAX = 100_000


def topics_of(method: str, request) -> list[str]:
    if method in ("Produce", "Fetch", "ListOffsets"):
        return sorted({p.topic for p in request.partitions})
    if method in ("CreateTopic", "DeleteTopic", "CreatePartitions", "AlterConfigs", "DescribeConfigs"):
        return [request.name]
    return []


class Authorizer:
    """ACL decisions against the live snapshot of an :class:`AclCache` (or a fixed one)."""

    def __init__(self, config: A.AuthorizerConfig, snapshot_source):
        self.config = config
        self.source = snapshot_source      # .snapshot -> AclSnapshot
        self._memo: dict = {}
        self._memo_of = None
        self._lock = threading.Lock()

    def allowed(self, principal: str, host: str, operation: str, resource: tuple[str, str]) -> bool:
        snap = self.source.snapshot
        key = (principal, host, operation, resource)
        with self._lock:
            if self._memo_of is not snap:
                self._memo, self._memo_of = {}, snap
            hit = self._memo.get(key)
        if hit is not None:
            return hit
        if operation == "IdempotentWrite":   # Kafka (KIP-679): IdempotentWrite on the cluster or Write on any topic
            ok = (A.authorize(snap, self.config, principal, host, operation, *resource)
                  or A.authorize_any(snap, self.config, principal, host, "Write", "Topic"))
        else:
            ok = A.authorize(snap, self.config, principal, host, operation, *resource)
        with self._lock:
            if self._memo_of is snap:
                if len(self._memo) >= DECISIONS_MAX:
                    self._memo.clear()
                self._memo[key] = ok
        return ok


def refusal(principal: str, host: str, operation: str, resource: tuple[str, str]) -> E.AuthorizationError:
    kind, name = resource
    text = f"{principal} (host {host}) is not allowed {operation} on {kind} {name!r}"
    if kind == "Cluster":
        return E.ClusterAuthorizationFailedError(text)
    return E.TopicAuthorizationFailedError(text)


class BrokerSecurity:
    """The broker's TLS credentials, authenticator and authorizer (see the module docstring)."""

    def __init__(self, config):
        self.config = config
        self.mapper = tls.PrincipalMapper(config.get("ssl.principal.mapping.rules"))
        self.mechanisms = tuple(config.get("sasl.enabled.mechanisms"))
        self.authorizer_enabled = bool(config.get("authorizer.class.name"))
        self.authorizer_config = A.AuthorizerConfig(
            A.AuthorizerConfig.parse_super_users(config.get("super.users")),
            config.get("allow.everyone.if.no.acl.found"))
        protocols = {e.protocol for e in config.get("listeners")}
        inter = config.get("security.inter.broker.protocol")
        if inter not in protocols:
            raise E.InvalidConfigError(f"security.inter.broker.protocol={inter} but no {inter} listener in "
                                       f"listeners ({', '.join(sorted(protocols))})")
        self.inter_broker = tls.ClientSecurity(
            inter, config.get("ssl.ca.location"), config.get("ssl.certificate.location"),
            config.get("ssl.key.location"), config.get("ssl.key.password"))
        self.zk_user = config.get("zookeeper.digest.username")
        self.zk_password = config.get("zookeeper.digest.password")
        self.zk_kwargs = kazoo_security(self.zk_user, self.zk_password, config.get("zookeeper.set.acl"))
        # One line per (principal, host, method, operation, resource) a minute, with a count (Kafka's
        # authorizer log, without letting a refused client flood it).
        self.refusals = RateLimitedLog(log)
        self.credentials: CredentialCache | None = None
        self.acls: AclCache | None = None
        self.authorizer: Authorizer | None = None

    @property
    def tls(self) -> bool:
        """This broker has TLS listeners (and so serves Flight over TLS too)."""
        return any(e.protocol in tls.TLS_PROTOCOLS for e in self.config.get("listeners"))

    @property
    def enabled(self) -> bool:
        """Anything beyond plaintext, anonymous, allow-all."""
        return (self.authorizer_enabled or any(e.protocol in tls.TLS_PROTOCOLS for e in self.config.get("listeners"))
                or bool(self.zk_kwargs))

    # ---- start-up (with the broker's ZooKeeper client) ----
    def start(self, zk, persistent_paths: tuple[str, ...]) -> None:
        if self.config.get("zookeeper.set.acl"):
            zk.ensure_path("/")
            # The roots only (existing children of a cluster that turns this on later keep their ACLs).
            secure_existing(zk, self.zk_user, self.zk_password,
                            ("/", "/brokers", "/admin", "/config", "/controller_epoch", CONFIG_USERS, ACL_ROOT,
                             ACL_CHANGES) + tuple(persistent_paths))
        self.credentials = CredentialCache(zk)
        self.credentials.start(sensitive_acl(self.zk_user, self.zk_password)
                               if self.config.get("zookeeper.set.acl") else None)
        if self.authorizer_enabled:
            self.acls = AclCache(zk)
            self.acls.start()
            self.authorizer = Authorizer(self.authorizer_config, self.acls)

    def server_credentials(self, listener) -> grpc.ServerCredentials:
        """TLS of an SSL or SASL_SSL listener. ``ssl.client.auth`` applies to SSL listeners
        only: on SASL_SSL the password authenticates (as Kafka since KIP-684)."""
        cfg = self.config
        client_auth = cfg.get("ssl.client.auth") if listener.protocol == "SSL" else "none"
        return tls.server_credentials(cfg.get("ssl.ca.location"), cfg.get("ssl.certificate.location"),
                                      cfg.get("ssl.key.location"), cfg.get("ssl.key.password"), client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """How this broker reaches other brokers (None = plaintext)."""
        return self.inter_broker.channel_credentials()

    # ---- RequestGate ----
    def authenticate(self, listener: str, grpc_context) -> str:
        if listener == "PLAINTEXT":
            return ANONYMOUS
        if listener == "SASL_SSL":
            return self._sasl_principal(grpc_context)
        subject = tls.subject_of(grpc_context.auth_context())
        return f"User:{self.mapper.name_of(subject)}" if subject else ANONYMOUS

    def _sasl_principal(self, grpc_context) -> str:
        token = next((v for k, v in grpc_context.invocation_metadata() if k == "authorization"), None)
        if token is None:
            raise E.SaslAuthenticationFailedError("a SASL_SSL listener needs a username and password with every "
                                                  "request (security.protocol=SASL_SSL, sasl.username, sasl.password)")
        return self.sasl_principal(token)

    def sasl_principal(self, token: str) -> str:
        """``User:<name>`` for an ``authorization`` value whose password matches the user's
        SCRAM credential; SASL_AUTHENTICATION_FAILED otherwise (also used by Flight)."""
        return self.password_principal(*tls.decode_sasl_token(token))

    def password_principal(self, mechanism: str, user: str, password: str) -> str:
        """``User:<name>`` when ``password`` matches the user's SCRAM credential in ZooKeeper
        (``mechanism`` must be enabled); SASL_AUTHENTICATION_FAILED otherwise. The one
        password check: SASL_SSL calls, Flight and the HTTP port's Basic auth use it."""
        if mechanism not in self.mechanisms:
            raise E.SaslAuthenticationFailedError(f"sasl.mechanism {mechanism} is not enabled on this broker "
                                                  f"(sasl.enabled.mechanisms={','.join(self.mechanisms)})")
        if not self.credentials.verify(mechanism, user, password):
            raise E.SaslAuthenticationFailedError(f"authentication failed for user {user!r} with {mechanism}: "
                                                  f"unknown user or wrong password")
        return f"User:{user}"

    def allowed(self, ctx, operation: str, resource: tuple[str, str]) -> bool:
        if self.authorizer is None:
            return True
        return self.authorizer.allowed(ctx.principal, ctx.peer_host, operation, resource)

    def authorize(self, ctx, spec, request) -> None:
        if self.authorizer is None:
            return
        if spec.kind == "cluster" or (spec.name == "Fetch" and request.replica_id >= 0):
            self.require(ctx, "ClusterAction", CLUSTER)
            return
        if spec.name in CLUSTER_OPERATIONS:
            self.require(ctx, CLUSTER_OPERATIONS[spec.name], CLUSTER)
            return
        if spec.name in HANDLER_DECIDES:
            return   # Metadata: the handler lists only what the caller may Describe
        op = TOPIC_OPERATIONS.get(spec.name)
        if op is None:   # fail closed: an RPC nobody wrote a rule for is for brokers only
            self.require(ctx, "ClusterAction", CLUSTER)
            return
        for topic in topics_of(spec.name, request):
            if op == "Create" and self.allowed(ctx, "Create", CLUSTER):
                continue   # Kafka: Create on the cluster covers every new topic
            self.require(ctx, op, ("Topic", topic))

    def require(self, ctx, operation: str, resource: tuple[str, str]) -> None:
        if not self.allowed(ctx, operation, resource):
            self.refusals.log(logging.INFO, (ctx.principal, ctx.peer_host, ctx.method, operation, resource),
                              "refused %s: %s (host %s) lacks %s on %s %r", ctx.method, ctx.principal,
                              ctx.peer_host, operation, *resource)
            raise refusal(ctx.principal, ctx.peer_host, operation, resource)
