"""An in-memory ZooKeeper for the deterministic simulation: the subset of kazoo's
``KazooClient`` API that ``broker/zk_store.py`` and the controller use, over one
shared tree with ZooKeeper's semantics where they matter to us:

* znode versions and conditional ``set`` / ``delete`` / ``check`` (BadVersionError);
* ephemeral nodes owned by a session, removed when the session expires;
* sequential nodes; ``multi`` (all or nothing, with ZooKeeper's per-op results:
  ops before the failing one RolledBackError, the failing one its own error, ops
  after it RuntimeInconsistency), built with ``transaction()`` or sent as kazoo's
  controller's request (``zk_store.state_multi_async``); ``multiRead`` (``zk_store._MultiRead``);
* one-shot data, exists and child watches, fired in the order of the changes;
* sessions that expire: the client's listeners hear LOST, every call raises
  SessionExpiredError until :meth:`SimKazooClient.reconnect` opens a new session
  (CONNECTED), as kazoo does after an expiry.

Single-threaded by design (the simulation runs everything in one thread): async
calls complete before they return. Watches are called synchronously; every
watcher in replikafka only enqueues an event.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.exceptions import (BadVersionError, ConnectionLoss, NoNodeError, NodeExistsError, NotEmptyError,
                              RolledBackError, RuntimeInconsistency, SessionExpiredError)
from kazoo.protocol.states import EventType, KazooState, KeeperState, WatchedEvent, ZnodeStat

from replikafka.broker import zk_store as Z


@dataclass
class _Node:
    data: bytes
    czxid: int
    mzxid: int
    version: int = 0
    cversion: int = 0
    owner: int = 0          # session id of an ephemeral's owner, 0 for persistent
    seq: int = 0            # next sequence number for sequential children

    def stat(self, children: int) -> ZnodeStat:
        return ZnodeStat(self.czxid, self.mzxid, 0, 0, self.version, self.cversion, 0, self.owner,
                         len(self.data), children, self.mzxid)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class SimZooKeeper:
    """The server: one tree, sessions, watches."""

    def __init__(self):
        self.nodes: dict[str, _Node] = {"/": _Node(b"", 0, 0)}
        self.zxid = 0
        self.next_session = 0x1000
        self.sessions: dict[int, "SimKazooClient"] = {}
        self.data_watches: dict[str, list] = {}
        self.child_watches: dict[str, list] = {}
        self.write_observers: list = []     # (path, data) of every create and set, for a test's model

    # ------------------------------------------------------------ sessions
    def open_session(self, client: "SimKazooClient") -> int:
        self.next_session += 1
        self.sessions[self.next_session] = client
        return self.next_session

    def expire(self, session_id: int) -> None:
        """The session times out: its ephemerals go (firing watches), its client hears LOST."""
        client = self.sessions.pop(session_id, None)
        for path in sorted((p for p, n in self.nodes.items() if n.owner == session_id), reverse=True):
            self._delete(path)
        if client is not None:
            client._lost()

    # ------------------------------------------------------------ tree
    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix):])

    def _fire(self, table: dict, path: str, kind) -> None:
        for cb in table.pop(path, []):
            cb(WatchedEvent(kind, KeeperState.CONNECTED, path))

    def _check_create(self, path: str, sequence: bool) -> str:
        parent = _parent(path)
        if parent not in self.nodes:
            raise NoNodeError(parent)
        if sequence:
            path = f"{path}{self.nodes[parent].seq:010d}"
        if path in self.nodes:
            raise NodeExistsError(path)
        return path

    def _create(self, path: str, data: bytes, owner: int) -> str:
        self.zxid += 1
        parent = _parent(path)
        self.nodes[path] = _Node(data, self.zxid, self.zxid, owner=owner)
        self.nodes[parent].cversion += 1
        self.nodes[parent].seq += 1
        for observe in self.write_observers:
            observe(path, data)
        self._fire(self.data_watches, path, EventType.CREATED)
        self._fire(self.child_watches, parent, EventType.CHILD)
        return path

    def _node(self, path: str, version: int = -1) -> _Node:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        if version != -1 and node.version != version:
            raise BadVersionError(path)
        return node

    def _set(self, path: str, data: bytes, version: int) -> ZnodeStat:
        node = self._node(path, version)
        self.zxid += 1
        node.data, node.version, node.mzxid = data, node.version + 1, self.zxid
        for observe in self.write_observers:
            observe(path, data)
        self._fire(self.data_watches, path, EventType.CHANGED)
        return node.stat(len(self.children(path)))

    def _check_delete(self, path: str, version: int) -> None:
        self._node(path, version)
        if self.children(path):
            raise NotEmptyError(path)

    def _delete(self, path: str) -> None:
        self.zxid += 1
        del self.nodes[path]
        parent = _parent(path)
        if parent in self.nodes:
            self.nodes[parent].cversion += 1
        self._fire(self.data_watches, path, EventType.DELETED)
        self._fire(self.child_watches, path, EventType.DELETED)
        self._fire(self.child_watches, parent, EventType.CHILD)


class _Done:
    """kazoo's IAsyncResult, already completed."""

    def __init__(self, value=None, exc: BaseException | None = None):
        self.value, self.exc = value, exc

    def get(self, block=True, timeout=None):
        if self.exc is not None:
            raise self.exc
        return self.value

    def set(self, value=None):
        self.value = value

    def set_exception(self, exc):
        self.exc = exc


class _Handler:
    def async_result(self):
        return _Done()


class _Transaction:
    def __init__(self, client: "SimKazooClient"):
        self.client, self.ops = client, []

    def check(self, path, version):
        self.ops.append(("check", path, version))

    def set_data(self, path, value, version=-1):
        self.ops.append(("set", path, value, version))

    def create(self, path, value=b"", acl=None, ephemeral=False, sequence=False):
        self.ops.append(("create", path, value, ephemeral, sequence))

    def delete(self, path, version=-1):
        self.ops.append(("delete", path, version))

    def commit_async(self):
        return _Done(self.commit())

    def commit(self):
        zk = self.client._server()
        # Validate every op against the tree as the earlier ops would leave it.
        shadow_versions: dict[str, int] = {}
        created: set[str] = set()
        deleted: set[str] = set()
        failed_at, error = -1, None
        for i, op in enumerate(self.ops):
            try:
                kind, path = op[0], op[1]
                exists = (path in zk.nodes or path in created) and path not in deleted
                if kind in ("check", "set", "delete"):
                    if not exists:
                        raise NoNodeError(path)
                    version = op[2] if kind != "set" else op[3]
                    current = shadow_versions.get(path, zk.nodes[path].version if path in zk.nodes else 0)
                    if version != -1 and version != current:
                        raise BadVersionError(path)
                    if kind == "set":
                        shadow_versions[path] = current + 1
                    if kind == "delete":
                        deleted.add(path)
                elif kind == "create":
                    if op[4]:
                        raise NotImplementedError("sequential create in a multi")
                    if exists:
                        raise NodeExistsError(path)
                    parent = _parent(path)
                    if (parent not in zk.nodes and parent not in created) or parent in deleted:
                        raise NoNodeError(parent)
                    created.add(path)
                    deleted.discard(path)
            except (NoNodeError, BadVersionError, NodeExistsError) as exc:
                failed_at, error = i, exc
                break
        if failed_at >= 0:
            return [RolledBackError() if i < failed_at else error if i == failed_at else RuntimeInconsistency()
                    for i in range(len(self.ops))]
        results = []
        for op in self.ops:
            kind, path = op[0], op[1]
            if kind == "check":
                results.append(True)
            elif kind == "set":
                results.append(zk._set(path, op[2], -1))
            elif kind == "create":
                results.append(zk._create(path, op[2], self.client.session_id if op[3] else 0))
            else:
                zk._delete(path)
                results.append(True)
        return results


class SimKazooClient:
    """One broker's connection to :class:`SimZooKeeper` (kazoo's calling conventions)."""

    chroot = ""

    def __init__(self, server: SimZooKeeper):
        self.server = server
        self.handler = _Handler()
        self.listeners: list = []
        self.session_id = server.open_session(self)
        self.expired = False
        self.connected = True   # kazoo's KazooClient.connected: False while the connection is down

    # ------------------------------------------------------------ sessions
    @property
    def client_id(self):
        return (self.session_id, b"")

    def add_listener(self, listener) -> None:
        self.listeners.append(listener)

    def _lost(self) -> None:
        self.expired = True
        for listener in list(self.listeners):
            listener(KazooState.LOST)

    def reconnect(self) -> None:
        """A new session after an expiry (kazoo reconnects by itself)."""
        self.session_id = self.server.open_session(self)
        self.expired = False
        self.connected = True
        for listener in list(self.listeners):
            listener(KazooState.CONNECTED)

    def disconnect(self) -> None:
        """The connection drops; the session lives on (calls raise ConnectionLoss, as kazoo's)."""
        self.connected = False
        for listener in list(self.listeners):
            listener(KazooState.SUSPENDED)

    def reconnect_same_session(self) -> None:
        """The connection is back within the session timeout: same session, ephemerals and watches."""
        self.connected = True
        for listener in list(self.listeners):
            listener(KazooState.CONNECTED)

    def _server(self) -> SimZooKeeper:
        if self.expired:
            raise SessionExpiredError()
        if not self.connected:
            raise ConnectionLoss()
        return self.server

    # ------------------------------------------------------------ kazoo's API (the part we use)
    def ensure_path(self, path: str) -> None:
        zk = self._server()
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in zk.nodes:
                zk._create(p, b"", 0)

    def create(self, path: str, value: bytes = b"", acl=None, ephemeral=False, sequence=False, makepath=False):
        zk = self._server()
        if makepath:
            parent = _parent(path)
            if parent not in zk.nodes:
                self.ensure_path(parent)
        path = zk._check_create(path, sequence)
        return zk._create(path, value, self.session_id if ephemeral else 0)

    def create_async(self, *args, **kw):
        try:
            return _Done(self.create(*args, **kw))
        except (NoNodeError, NodeExistsError) as exc:
            return _Done(exc=exc)

    def get(self, path: str, watch=None):
        zk = self._server()
        node = zk._node(path)
        if watch is not None:
            zk.data_watches.setdefault(path, []).append(watch)
        return node.data, node.stat(len(zk.children(path)))

    def get_async(self, path: str, watch=None):
        try:
            return _Done(self.get(path, watch))
        except NoNodeError as exc:
            return _Done(exc=exc)

    def exists(self, path: str, watch=None):
        zk = self._server()
        if watch is not None:
            zk.data_watches.setdefault(path, []).append(watch)
        node = zk.nodes.get(path)
        return None if node is None else node.stat(len(zk.children(path)))

    def get_children(self, path: str, watch=None):
        zk = self._server()
        zk._node(path)
        if watch is not None:
            zk.child_watches.setdefault(path, []).append(watch)
        return zk.children(path)

    def set(self, path: str, value: bytes, version: int = -1):
        return self._server()._set(path, value, version)

    def set_async(self, path: str, value: bytes, version: int = -1):
        try:
            return _Done(self.set(path, value, version))
        except Exception as exc:      # noqa: BLE001 - as kazoo's: every failure comes from get()
            return _Done(exc=exc)

    def delete(self, path: str, version: int = -1, recursive: bool = False):
        zk = self._server()
        if recursive:
            for child in zk.children(path) if path in zk.nodes else []:
                self.delete(f"{path}/{child}", recursive=True)
        zk._check_delete(path, version)
        zk._delete(path)

    def transaction(self):
        return _Transaction(self)

    def _call(self, request, async_object):
        """``zk_store._MultiRead``, and the controller's multi of an epoch check and state
        sets (``zk_store._StateMulti``, from ``zk_store.state_multi_async``), come this way;
        the latter answers as it parses: (the check's answer, [version or exception per set])."""
        if isinstance(request, Z._StateMulti):
            tx = _Transaction(self)
            tx.check(*request.check)
            for tp, _op in request.writes:
                state, version = request.updates[tp]
                tx.set_data(Z.state_path(*tp), state.to_json(), version)
            results = tx.commit()
            async_object.set((results[0], [r if isinstance(r, Exception) else r.version for r in results[1:]]))
            return True
        zk = self._server()
        out = []
        for path in request.paths:
            node = zk.nodes.get(path)
            out.append(NoNodeError() if node is None else (node.data, node.stat(len(zk.children(path)))))
        async_object.set(out)
        return True
