"""Security state in ZooKeeper, in Kafka's layout, and ZooKeeper's own ACLs.

Layout::

    /kafka-acl/Topic/<name>                    literal ACLs   {"version":1,"acls":[{"principal":..,"permissionType":..,"operation":..,"host":..}]}
    /kafka-acl/Cluster/kafka-cluster           cluster ACLs
    /kafka-acl-extended/prefixed/Topic/<prefix> prefixed ACLs (Kafka's KIP-290 path)
    /kafka-acl-changes/acl_changes_NNNNNNNNNN  a change notification (sequential; value = the pattern changed)
    /config/users/<user>                       {"version":1,"config":{"SCRAM-SHA-256":"salt=..,stored_key=..,server_key=..,iterations=N"}}
    /config/changes/config_change_NNNNNNNNNN   {"version":2,"entity_path":"users/<user>"}

Writers update a resource's znode with a conditional write on its version and
then add a change notification; brokers watch the notifications and reload
(:class:`AclCache`, :class:`CredentialCache`), so a change is live within a
ZooKeeper round trip. Notifications older than :data:`NOTIFICATION_TTL_S`
are removed by the next writer (Kafka keeps them 15 minutes).

ZooKeeper ACLs (``zookeeper.set.acl=true``): :func:`kazoo_security` gives a
kazoo client digest credentials and a default ACL that lets only that digest
user write (everyone may read, as Kafka's world-readable znodes);
:data:`SENSITIVE_ROOTS` (the SCRAM credentials) are readable by brokers only.

Thread-safety: the caches swap immutable snapshots; the stores hold only the
(thread-safe) kazoo client.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.security import ACL, Permissions, make_digest_acl, make_acl

from replikafka import errors as E
from replikafka.security import acl as A
from replikafka.security import scram

log = logging.getLogger(__name__)

ACL_ROOT = "/kafka-acl"
ACL_PREFIXED_ROOT = "/kafka-acl-extended/prefixed"
ACL_CHANGES = "/kafka-acl-changes"
CONFIG_USERS = "/config/users"
CONFIG_CHANGES = "/config/changes"
NOTIFICATION_TTL_S = 15 * 60
SENSITIVE_ROOTS = (CONFIG_USERS,)
CAS_ATTEMPTS_MAX = 20


def pattern_path(pattern: A.ResourcePattern) -> str:
    root = ACL_PREFIXED_ROOT if pattern.pattern_type == "prefixed" else ACL_ROOT
    return f"{root}/{pattern.resource_type}/{pattern.name}"


def _pattern_str(pattern: A.ResourcePattern) -> str:
    return f"{pattern.pattern_type}:{pattern.resource_type}:{pattern.name}"


# ---- ZooKeeper's own ACLs -------------------------------------------------------
def kazoo_security(username: str, password: str, set_acl: bool) -> dict:
    """Keyword arguments for ``KazooClient``: digest credentials (if any) and, with
    ``set_acl``, the default ACL of every znode this client creates."""
    if not username:
        if set_acl:
            raise E.InvalidConfigError("zookeeper.set.acl=true needs zookeeper.digest.username and "
                                       "zookeeper.digest.password (the identity brokers write as)")
        return {}
    if not password:
        raise E.InvalidConfigError("zookeeper.digest.username is set but zookeeper.digest.password is empty")
    kwargs: dict = {"auth_data": [("digest", f"{username}:{password}")]}
    if set_acl:
        kwargs["default_acl"] = [make_digest_acl(username, password, all=True), world_read()]
    return kwargs


def world_read() -> ACL:
    return make_acl("world", "anyone", read=True)


def sensitive_acl(username: str, password: str) -> list[ACL]:
    """Only the brokers' digest user, not even read for others (SCRAM credentials)."""
    return [make_digest_acl(username, password, all=True)]


def secure_existing(zk, username: str, password: str, paths: tuple[str, ...]) -> None:
    """Give already-existing persistent roots the brokers-only-write ACL (a cluster that
    turns zookeeper.set.acl on later; Kafka's zookeeper-security-migration)."""
    default = [make_digest_acl(username, password, all=True), world_read()]
    for path in paths:
        try:
            acls, _ = zk.get_acls(path)
            want = sensitive_acl(username, password) if path in SENSITIVE_ROOTS else default
            if list(acls) != want:
                zk.set_acls(path, want)
        except NoNodeError:
            continue


# ---- ACL store -------------------------------------------------------------------
class AclStore:
    """Reads and changes ACL znodes (used by brokers' caches and ``replikafka acls``)."""

    def __init__(self, zk):
        self.zk = zk

    def ensure_paths(self) -> None:
        for rt in A.RESOURCE_TYPES:
            self.zk.ensure_path(f"{ACL_ROOT}/{rt}")
        self.zk.ensure_path(f"{ACL_PREFIXED_ROOT}/Topic")
        self.zk.ensure_path(ACL_CHANGES)

    def get(self, pattern: A.ResourcePattern) -> tuple[frozenset[A.AclEntry], int]:
        try:
            data, stat = self.zk.get(pattern_path(pattern))
        except NoNodeError:
            return frozenset(), -1
        return A.acls_from_json(data), stat.version

    def snapshot(self) -> A.AclSnapshot:
        acls: dict[A.ResourcePattern, frozenset[A.AclEntry]] = {}
        for root, ptype in ((ACL_ROOT, "literal"), (ACL_PREFIXED_ROOT, "prefixed")):
            for rt in A.RESOURCE_TYPES:
                try:
                    names = self.zk.get_children(f"{root}/{rt}")
                except NoNodeError:
                    continue
                for name in names:
                    try:
                        pattern = A.ResourcePattern(rt, name, ptype)
                        entries, _ = self.get(pattern)
                    except E.InvalidConfigError as exc:
                        log.warning("ignoring ACL znode %s/%s/%s: %s", root, rt, name, exc)
                        continue
                    if entries:
                        acls[pattern] = entries
        return A.AclSnapshot(acls)

    def change(self, pattern: A.ResourcePattern, add: frozenset[A.AclEntry] = frozenset(),
               remove: frozenset[A.AclEntry] | None = frozenset()) -> frozenset[A.AclEntry]:
        """Adds ``add`` and removes ``remove`` (None: every entry) in one conditional write;
        returns the pattern's entries after it."""
        path = pattern_path(pattern)
        for _ in range(CAS_ATTEMPTS_MAX):
            current, version = self.get(pattern)
            after = (frozenset() if remove is None else current - remove) | add
            if after == current:
                return current
            try:
                if version < 0:
                    self.zk.create(path, A.acls_to_json(after), makepath=True)
                elif after:
                    self.zk.set(path, A.acls_to_json(after), version=version)
                else:
                    self.zk.delete(path, version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue
            self._notify(_pattern_str(pattern))
            return after
        raise E.ReplikafkaError(f"ACLs of {pattern} changed concurrently {CAS_ATTEMPTS_MAX} times; try again")

    def _notify(self, what: str) -> None:
        self.zk.create(f"{ACL_CHANGES}/acl_changes_", what.encode(), sequence=True, makepath=True)
        _expire_notifications(self.zk, ACL_CHANGES)


def _expire_notifications(zk, root: str) -> None:
    cutoff_ms = (time.time() - NOTIFICATION_TTL_S) * 1000
    for child in sorted(zk.get_children(root))[:-1]:   # keep the newest: it is what watchers compare to
        try:
            _, stat = zk.get(f"{root}/{child}")
            if stat.ctime < cutoff_ms:
                zk.delete(f"{root}/{child}")
        except NoNodeError:
            pass


# ---- SCRAM credential store -----------------------------------------------------------
class CredentialStore:
    """``/config/users/<user>``: SCRAM credentials (never passwords)."""

    def __init__(self, zk, sensitive_acl_: list[ACL] | None = None):
        self.zk = zk
        self.acl = sensitive_acl_

    def get(self, user: str) -> dict[str, scram.ScramCredential]:
        try:
            data, _ = self.zk.get(f"{CONFIG_USERS}/{user}")
        except NoNodeError:
            return {}
        return _credentials_from_json(user, data)

    def users(self) -> list[str]:
        try:
            return sorted(self.zk.get_children(CONFIG_USERS))
        except NoNodeError:
            return []

    def alter(self, user: str, add: dict[str, scram.ScramCredential], delete: tuple[str, ...] = ()) -> None:
        if not user or "/" in user:
            raise E.InvalidConfigError(f"user name {user!r} is not legal")
        path = f"{CONFIG_USERS}/{user}"
        for _ in range(CAS_ATTEMPTS_MAX):
            try:
                data, stat = self.zk.get(path)
                config = json.loads(data).get("config", {})
                version = stat.version
            except NoNodeError:
                config, version = {}, -1
            for mech in delete:
                config.pop(mech, None)
            config.update({m: c.to_config() for m, c in add.items()})
            body = json.dumps({"version": 1, "config": config}, sort_keys=True).encode()
            try:
                if version < 0:
                    if not self.zk.exists(CONFIG_USERS):
                        self.zk.create(CONFIG_USERS, b"", acl=self.acl, makepath=True)
                    self.zk.create(path, body, acl=self.acl)
                else:
                    self.zk.set(path, body, version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue
            self.zk.create(f"{CONFIG_CHANGES}/config_change_",
                           json.dumps({"version": 2, "entity_path": f"users/{user}"}).encode(),
                           sequence=True, makepath=True)
            _expire_notifications(self.zk, CONFIG_CHANGES)
            return
        raise E.ReplikafkaError(f"user {user} changed concurrently {CAS_ATTEMPTS_MAX} times; try again")


def _credentials_from_json(user: str, data: bytes) -> dict[str, scram.ScramCredential]:
    try:
        config = json.loads(data).get("config", {})
        return {m: scram.ScramCredential.from_config(v) for m, v in config.items() if m in scram.MECHANISMS}
    except (ValueError, AttributeError, E.InvalidConfigError) as exc:
        log.warning("ignoring the credentials of user %s: %s", user, exc)
        return {}


# ---- broker-side caches, kept current by watches ---------------------------------------
class AclCache:
    """The broker's current :class:`AclSnapshot`; a child watch on the change
    notifications reloads it (the reload runs on kazoo's event thread, and a
    failed reload is retried by the next notification or :meth:`do_work`)."""

    def __init__(self, zk, on_change: Callable[[A.AclSnapshot], None] | None = None):
        self.store = AclStore(zk)
        self.snapshot = A.AclSnapshot()
        self.on_change = on_change
        self._dirty = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        self.store.ensure_paths()
        self.do_work(force=True)
        self.store.zk.ChildrenWatch(ACL_CHANGES, self._changed)

    def _changed(self, _children) -> None:
        self._dirty.set()
        self.do_work()

    def do_work(self, force: bool = False) -> bool:
        """Reload if a notification arrived (or ``force``); True if it reloaded."""
        if not (force or self._dirty.is_set()):
            return False
        with self._lock:
            self._dirty.clear()
            try:
                snap = self.store.snapshot()
            except Exception as exc:   # ZooKeeper unavailable: keep the last snapshot, retry later
                self._dirty.set()
                log.warning("reloading ACLs failed (%s); keeping the previous ones", exc)
                return False
            self.snapshot = snap
        if self.on_change:
            self.on_change(snap)
        return True


class CredentialCache:
    """SCRAM credentials by user, each kept current by a data watch; verified
    passwords are remembered per credential so PBKDF2 runs once, not per call.

    Only users that exist (a child watch on ``/config/users``) get a data watch,
    so names a client makes up cannot grow the broker's watches or memory."""

    VERIFIED_MAX = 10_000

    def __init__(self, zk):
        self.zk = zk
        self._users: frozenset[str] = frozenset()
        self._creds: dict[str, dict[str, scram.ScramCredential]] = {}
        self._watched: set[str] = set()
        self._verified: dict[tuple[str, str, bytes], scram.ScramCredential] = {}
        self._lock = threading.Lock()

    def start(self, acl: list[ACL] | None = None) -> None:
        """Watch the user list (``acl``: of ``/config/users`` if this creates it)."""
        if not self.zk.exists(CONFIG_USERS):
            try:
                self.zk.create(CONFIG_USERS, b"", acl=acl, makepath=True)
            except NodeExistsError:
                pass
        self.zk.ChildrenWatch(CONFIG_USERS, self._on_users)

    def _on_users(self, children) -> None:
        with self._lock:
            self._users = frozenset(children)

    def credentials(self, user: str) -> dict[str, scram.ScramCredential]:
        with self._lock:
            if user not in self._users:
                return {}
            if user in self._watched:
                return self._creds.get(user, {})
            self._watched.add(user)
        ready = threading.Event()

        def on_data(data, _stat):
            creds = _credentials_from_json(user, data) if data else {}
            with self._lock:
                self._creds[user] = creds
            ready.set()

        self.zk.DataWatch(f"{CONFIG_USERS}/{user}", on_data)
        ready.wait(10)
        with self._lock:
            return self._creds.get(user, {})

    def verify(self, mechanism: str, user: str, password: str) -> bool:
        """PLAIN checks against any SCRAM credential the user has; SCRAM-SHA-* against that one."""
        import hashlib
        creds = self.credentials(user)
        mechs = [mechanism] if mechanism in scram.MECHANISMS else sorted(creds)
        digest = hashlib.sha256(password.encode()).digest()
        for mech in mechs:
            cred = creds.get(mech)
            if cred is None:
                continue
            key = (user, mech, digest)
            with self._lock:
                if self._verified.get(key) is cred:
                    return True
            if scram.verify(mech, cred, password):
                with self._lock:
                    if len(self._verified) >= self.VERIFIED_MAX:
                        self._verified.clear()
                    self._verified[key] = cred
                return True
        return False
