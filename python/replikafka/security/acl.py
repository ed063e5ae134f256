"""ACLs, Kafka's model, and the pure decision core of the authorizer.

An ACL is (principal, host, operation, permission) on a resource pattern
(resource type, name, pattern type). Kafka's rules, as AclAuthorizer applies them:

- a super user (``super.users``) may do anything;
- the ACLs that apply to a resource are those on its literal name, on the
  wildcard ``*`` and on every prefixed pattern its name starts with;
- a matching DENY wins over any ALLOW;
- an ALLOW of Read, Write, Delete or Alter implies Describe (AlterConfigs
  implies DescribeConfigs); All matches every operation;
- a resource with no ACL at all is allowed only with
  ``allow.everyone.if.no.acl.found`` (false by default when an authorizer is
  configured).

Nothing here does I/O: :class:`AclSnapshot` is an immutable value the broker
swaps when ZooKeeper says the ACLs changed, so a decision never holds a lock.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from replikafka import errors as E

# ---- vocabulary (Kafka's spelling, as in ZooKeeper and on the command line) ----
OPERATIONS = ("Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction",
              "DescribeConfigs", "AlterConfigs", "IdempotentWrite", "All")
PERMISSIONS = ("Allow", "Deny")
RESOURCE_TYPES = ("Topic", "Cluster")
PATTERN_TYPES = ("literal", "prefixed")
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
ANONYMOUS = "User:ANONYMOUS"

# An ALLOW of one of these also allows Describe (Kafka: AclAuthorizer.matchingAclExists).
_IMPLIES = {"Describe": ("Read", "Write", "Delete", "Alter", "Describe"),
            "DescribeConfigs": ("AlterConfigs", "DescribeConfigs")}


def _canonical(value: str, allowed: tuple[str, ...], what: str) -> str:
    """Kafka's spelling of a case-insensitive name (``read`` -> ``Read``), or an error naming it."""
    for name in allowed:
        if name.lower() == value.strip().lower().replace("_", "").replace("-", "") \
                or name.lower() == value.strip().lower():
            return name
    raise E.InvalidConfigError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def operation_name(value: str) -> str:
    return _canonical(value, OPERATIONS, "operation")


def permission_name(value: str) -> str:
    return _canonical(value, PERMISSIONS, "permission")


def pattern_type_name(value: str) -> str:
    return _canonical(value, PATTERN_TYPES, "resource pattern type")


def check_principal(value: str) -> str:
    """``Type:name`` (``User:alice``, ``User:*``), or an error naming the value."""
    kind, sep, name = value.strip().partition(":")
    if not sep or not kind or not name:
        raise E.InvalidConfigError(f"principal {value!r} is not 'Type:name' (e.g. User:alice)")
    return f"{kind}:{name}"


@dataclass(frozen=True, order=True)
class ResourcePattern:
    """What an ACL is on: ``Topic`` literal/prefixed name, or the ``Cluster``."""
    resource_type: str
    name: str
    pattern_type: str = "literal"

    def __post_init__(self):
        if self.resource_type not in RESOURCE_TYPES:
            raise E.InvalidConfigError(f"resource type {self.resource_type!r} is not one of {RESOURCE_TYPES}")
        if self.pattern_type not in PATTERN_TYPES:
            raise E.InvalidConfigError(f"pattern type {self.pattern_type!r} is not one of {PATTERN_TYPES}")
        if not self.name:
            raise E.InvalidConfigError("a resource pattern needs a name")
        if self.resource_type == "Cluster" and (self.name != CLUSTER_NAME or self.pattern_type != "literal"):
            raise E.InvalidConfigError(f"the cluster resource is the literal {CLUSTER_NAME!r}")
        if self.pattern_type == "prefixed" and self.name == WILDCARD:
            raise E.InvalidConfigError("a prefixed pattern cannot be '*' (use a literal '*')")

    def matches(self, resource_type: str, name: str) -> bool:
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == "prefixed":
            return name.startswith(self.name)
        return self.name == WILDCARD or self.name == name

    def __str__(self) -> str:
        return f"ResourcePattern(resourceType={self.resource_type}, name={self.name}, patternType={self.pattern_type.upper()})"


CLUSTER = ResourcePattern("Cluster", CLUSTER_NAME)


@dataclass(frozen=True, order=True)
class AclEntry:
    """One access control entry of a resource pattern (Kafka's AccessControlEntry)."""
    principal: str
    host: str
    operation: str
    permission: str

    def __post_init__(self):
        check_principal(self.principal)
        operation_name(self.operation)
        permission_name(self.permission)
        if not self.host:
            raise E.InvalidConfigError("an ACL needs a host ('*' for any)")

    def matches(self, principal: str, host: str, operation: str) -> bool:
        if self.principal not in (principal, "User:*"):
            return False
        if self.host not in (WILDCARD, host):
            return False
        if self.permission == "Deny":
            return self.operation in ("All", operation)
        return self.operation == "All" or self.operation in _IMPLIES.get(operation, (operation,))

    def to_json(self) -> dict:
        return {"principal": self.principal, "permissionType": self.permission,
                "operation": self.operation, "host": self.host}

    @staticmethod
    def from_json(d: Mapping) -> "AclEntry":
        return AclEntry(str(d["principal"]), str(d.get("host", WILDCARD)),
                        operation_name(str(d["operation"])), permission_name(str(d["permissionType"])))

    def __str__(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, operation={self.operation.upper()}, "
                f"permissionType={self.permission.upper()})")


def acls_to_json(entries: Iterable[AclEntry]) -> bytes:
    """The value of a resource's ACL znode (Kafka's format)."""
    return json.dumps({"version": 1, "acls": [e.to_json() for e in sorted(set(entries))]},
                      sort_keys=True).encode()


def acls_from_json(data: bytes | None) -> frozenset[AclEntry]:
    if not data:
        return frozenset()
    try:
        d = json.loads(data)
        return frozenset(AclEntry.from_json(a) for a in d.get("acls", []))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise E.InvalidConfigError(f"ACL znode is not valid: {exc}") from None


@dataclass(frozen=True)
class AuthorizerConfig:
    """The broker keys the decisions depend on."""
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False

    @staticmethod
    def parse_super_users(value: str) -> frozenset[str]:
        """Kafka's ``super.users``: principals separated by ``;`` (``User:admin;User:broker``)."""
        return frozenset(check_principal(p) for p in value.split(";") if p.strip())


@dataclass(frozen=True)
class AclSnapshot:
    """Every ACL the cluster has at one moment: pattern -> entries (immutable)."""
    acls: Mapping[ResourcePattern, frozenset[AclEntry]] = field(default_factory=dict)

    def matching(self, resource_type: str, name: str) -> list[AclEntry]:
        out: list[AclEntry] = []
        for pattern, entries in self.acls.items():
            if pattern.matches(resource_type, name):
                out.extend(entries)
        return out

    def with_pattern(self, pattern: ResourcePattern, entries: Iterable[AclEntry]) -> "AclSnapshot":
        acls = dict(self.acls)
        entries = frozenset(entries)
        if entries:
            acls[pattern] = entries
        else:
            acls.pop(pattern, None)
        return AclSnapshot(acls)


def authorize(snapshot: AclSnapshot, config: AuthorizerConfig, principal: str, host: str,
              operation: str, resource_type: str, name: str) -> bool:
    """Kafka's decision for one (principal, host, operation, resource)."""
    if principal in config.super_users:
        return True
    entries = snapshot.matching(resource_type, name)
    if not entries:
        return config.allow_everyone_if_no_acl_found
    if any(e.permission == "Deny" and e.matches(principal, host, operation) for e in entries):
        return False
    return any(e.permission == "Allow" and e.matches(principal, host, operation) for e in entries)


def authorize_any(snapshot: AclSnapshot, config: AuthorizerConfig, principal: str, host: str,
                  operation: str, resource_type: str) -> bool:
    """Whether the principal may do ``operation`` on at least one resource of the type
    (Kafka's authorizeByResourceType, KIP-679: an idempotent producer needs Write on some topic)."""
    if principal in config.super_users:
        return True
    for pattern, entries in snapshot.acls.items():
        if pattern.resource_type != resource_type:
            continue
        allowed = [e for e in entries if e.permission == "Allow" and e.matches(principal, host, operation)]
        if not allowed:
            continue
        # A DENY on the same literal/prefix (or a wider one) cancels it; a narrower DENY does not.
        if pattern.pattern_type == "literal" and pattern.name != WILDCARD:
            if authorize(snapshot, config, principal, host, operation, resource_type, pattern.name):
                return True
        else:
            denied = any(e.permission == "Deny" and e.matches(principal, host, operation)
                         for p, es in snapshot.acls.items() if p.resource_type == resource_type
                         and (p.name == WILDCARD or (p.pattern_type == "prefixed" and pattern.name.startswith(p.name)))
                         for e in es)
            if not denied:
                return True
    return False
