"""The cluster status page every broker serves on its HTTP port (read-only).

One page: the brokers (live or not, which is controller), the topics'
partitions (leader, replicas, ISR, and from each partition's leader its HW,
LEO, log start and each follower's lag as HW minus the follower's fetch
offset), under-replicated and offline partitions highlighted, reassignments in
progress. It refreshes itself (``<meta http-equiv=refresh>``) and pages and
filters server-side, so 10,000 partitions stay readable: the filter runs over
this broker's metadata cache and only the page shown asks the leaders for
offsets (one small HTTP request per leader, in parallel, bounded by a timeout).

Pure parts (:func:`select_partitions`, :func:`render_html`) take plain data;
:class:`ClusterView` gathers that data from a broker.
"""
from __future__ import annotations

import concurrent.futures
import html
import json
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

PAGE_SIZE_DEFAULT = 100
PAGE_SIZE_MAX = 1000
REFRESH_S_DEFAULT = 5
PEER_TIMEOUT_S = 2.0
STATES = ("all", "under-replicated", "offline", "under-min-isr")


@dataclass
class PartitionRow:
    topic: str
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    leader_epoch: int
    min_isr: int
    offline: bool = False
    detail: dict | None = None      # the leader's view: hw, leo, log_start, followers {id: fetch offset}

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def under_min_isr(self) -> bool:
        return len(self.isr) < self.min_isr

    @property
    def css(self) -> str:
        classes = []
        if self.offline:
            classes.append("offline")
        if self.under_replicated:
            classes.append("under-replicated")
        if self.under_min_isr:
            classes.append("under-min-isr")
        return " ".join(classes) or "ok"


@dataclass
class Query:
    topic: str = ""
    state: str = "all"
    page: int = 1
    size: int = PAGE_SIZE_DEFAULT
    refresh_s: int = REFRESH_S_DEFAULT

    @classmethod
    def parse(cls, query_string: str) -> "Query":
        """From a URL's query string; bad values fall back to defaults (a status page never errors out)."""
        q = urllib.parse.parse_qs(query_string)

        def one(name, default):
            return q.get(name, [default])[0]

        def num(name, default, lo, hi):
            try:
                return max(lo, min(hi, int(one(name, default))))
            except ValueError:
                return default

        state = one("state", "all")
        return cls(topic=one("topic", "").strip(), state=state if state in STATES else "all",
                   page=num("page", 1, 1, 10**9), size=num("size", PAGE_SIZE_DEFAULT, 1, PAGE_SIZE_MAX),
                   refresh_s=num("refresh", REFRESH_S_DEFAULT, 0, 3600))

    def url(self, **changes) -> str:
        d = {"topic": self.topic, "state": self.state, "page": self.page, "size": self.size,
             "refresh": self.refresh_s}
        d.update(changes)
        return "?" + urllib.parse.urlencode({k: v for k, v in d.items() if v not in ("", None)})


@dataclass
class ClusterSnapshot:
    broker_id: int                         # the broker serving the page
    controller_id: int
    brokers: dict[int, str]                # live broker id -> host:port
    rows: list[PartitionRow]
    reassignments: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    taken_at: float = field(default_factory=time.time)


def select_partitions(rows: list[PartitionRow], q: Query) -> tuple[list[PartitionRow], int]:
    """The page of rows matching the query, and how many matched in all."""
    wanted = {"all": lambda r: True, "under-replicated": lambda r: r.under_replicated or r.offline,
              "offline": lambda r: r.offline, "under-min-isr": lambda r: r.under_min_isr}[q.state]
    matched = [r for r in rows if (not q.topic or q.topic in r.topic) and wanted(r)]
    start = (q.page - 1) * q.size
    return matched[start:start + q.size], len(matched)


def _ids(ids) -> str:
    return ",".join(str(i) for i in ids)


def render_html(snap: ClusterSnapshot, q: Query, page_rows: list[PartitionRow], matched: int) -> str:
    e = html.escape
    total = len(snap.rows)
    under = sum(r.under_replicated for r in snap.rows)
    offline = sum(r.offline for r in snap.rows)
    under_min = sum(r.under_min_isr for r in snap.rows)
    replica_ids = sorted({b for r in snap.rows for b in r.replicas} | set(snap.brokers))
    led = {}
    for r in snap.rows:
        led[r.leader] = led.get(r.leader, 0) + 1
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           f"<title>replikafka cluster (broker {snap.broker_id})</title>"]
    if q.refresh_s:
        out.append(f"<meta http-equiv='refresh' content='{q.refresh_s}'>")
    out.append("""<style>
body{font-family:sans-serif;margin:1em;color:#222}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}th{background:#eee}
tr.under-replicated td{background:#fff3cd}tr.offline td{background:#f8d7da;font-weight:bold}
tr.broker-offline td{background:#f8d7da}.summary span{margin-right:1.5em}
.bad{color:#b00;font-weight:bold}form{margin:.5em 0}
</style></head><body>""")
    out.append(f"<h1>replikafka cluster</h1><p>Served by broker {snap.broker_id} at "
               f"{e(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(snap.taken_at)))}"
               f"{f'; refreshes every {q.refresh_s} s' if q.refresh_s else ''}.</p>")
    out.append(f"<p class='summary' id='summary'><span>partitions: <b id='partition-count'>{total}</b></span>"
               f"<span class='{'bad' if under else ''}'>under-replicated: <b id='under-replicated-count'>{under}"
               f"</b></span><span class='{'bad' if offline else ''}'>offline: <b id='offline-count'>{offline}"
               f"</b></span><span>under min ISR: <b id='under-min-isr-count'>{under_min}</b></span>"
               f"<span>controller: <b id='controller'>{snap.controller_id}</b></span></p>")
    out.append("<h2>Brokers</h2><table id='brokers'><tr><th>id</th><th>address</th><th>state</th>"
               "<th>controller</th><th>leads</th></tr>")
    for b in replica_ids:
        live = b in snap.brokers
        out.append(f"<tr class='{'broker-live' if live else 'broker-offline'}' data-broker='{b}'><td>{b}</td>"
                   f"<td>{e(snap.brokers.get(b, '-'))}</td><td>{'live' if live else 'offline'}</td>"
                   f"<td>{'yes' if b == snap.controller_id else ''}</td><td>{led.get(b, 0)}</td></tr>")
    out.append("</table>")
    out.append("<h2>Reassignments in progress</h2>")
    if snap.reassignments:
        out.append("<table id='reassignments'><tr><th>partition</th><th>target replicas</th></tr>")
        for (t, p), target in sorted(snap.reassignments.items()):
            out.append(f"<tr><td>{e(t)}-{p}</td><td>{_ids(target)}</td></tr>")
        out.append("</table>")
    else:
        out.append("<p id='reassignments'>none</p>")
    out.append("<h2>Partitions</h2><form method='get'>"
               f"topic contains <input name='topic' value='{e(q.topic)}'> "
               "<select name='state'>" + "".join(
                   f"<option{' selected' if s == q.state else ''}>{s}</option>" for s in STATES) + "</select> "
               f"per page <input name='size' size='4' value='{q.size}'>"
               f"<input type='hidden' name='refresh' value='{q.refresh_s}'> <button>show</button></form>")
    pages = max(1, -(-matched // q.size))
    nav = [f"<span id='page-info'>page {q.page} of {pages} ({matched} partitions match)</span>"]
    if q.page > 1:
        nav.append(f" <a id='prev' href='{e(q.url(page=q.page - 1))}'>previous</a>")
    if q.page < pages:
        nav.append(f" <a id='next' href='{e(q.url(page=q.page + 1))}'>next</a>")
    out.append("<p>" + "".join(nav) + "</p>")
    out.append("<table id='partitions'><tr><th>topic</th><th>partition</th><th>leader</th><th>epoch</th>"
               "<th>replicas</th><th>ISR</th><th>HW</th><th>LEO</th><th>log start</th>"
               "<th>HW - follower fetch offset</th><th>state</th></tr>")
    for r in page_rows:
        d = r.detail or {}
        followers = d.get("followers", {})
        lag = ", ".join(f"{f}: {d['hw'] - pos if pos >= 0 else '?'}" for f, pos in sorted(followers.items(),
                                                                                          key=lambda x: int(x[0])))
        state = r.css if r.css != "ok" else "in sync"
        out.append(f"<tr class='{r.css}' data-topic='{e(r.topic)}' data-partition='{r.partition}' "
                   f"data-leader='{r.leader}'><td>{e(r.topic)}</td><td>{r.partition}</td>"
                   f"<td>{r.leader if r.leader >= 0 else 'none'}</td><td>{r.leader_epoch}</td>"
                   f"<td>{_ids(r.replicas)}</td><td>{_ids(r.isr)}</td><td>{d.get('hw', '?')}</td>"
                   f"<td>{d.get('leo', '?')}</td><td>{d.get('log_start', '?')}</td><td>{e(lag)}</td>"
                   f"<td class='state'>{e(state)}</td></tr>")
    out.append("</table></body></html>")
    return "".join(out)


# ---------------------------------------------------------------- gathering the data from a broker
def local_replicas(replica_manager, tps: list[tuple[str, int]] | None) -> dict[str, dict]:
    """This broker's view of its replicas (``tps``, or all): ``"topic:partition" ->
    {role, hw, leo, log_start, leader_epoch, followers: {id: fetch offset}}``."""
    from replikafka.broker.replica.partition import LEADER
    with replica_manager.lock:
        parts = [replica_manager.partitions.get(tp) for tp in tps] if tps is not None \
            else list(replica_manager.partitions.values())
    out = {}
    for part in parts:
        if part is None:
            continue
        with part.lock:
            st = part.leader_state
            d = {"role": part.role, "hw": part.hw, "leo": part.log.log_end_offset,
                 "log_start": part.log.log_start_offset, "leader_epoch": part.leader_epoch}
            if part.role == LEADER and st is not None:
                d["followers"] = {str(r): p.leo for r, p in st.progress.items()}
        out[f"{part.topic}:{part.partition}"] = d
    return out


def parse_tps(values: list[str]) -> list[tuple[str, int]]:
    """``["topic:0", ...]`` -> tuples; malformed entries are skipped."""
    out = []
    for v in values:
        topic, _, p = v.rpartition(":")
        if topic and p.isdigit():
            out.append((topic, int(p)))
    return out


class ClusterView:
    """Gathers a :class:`ClusterSnapshot` from a running broker: partitions from its
    metadata cache, brokers, controller and reassignments from ZooKeeper, offsets
    from the leaders' ``/replicas.json`` (this broker's own answered in-process)."""

    def __init__(self, broker, peer_http_urls, opener=None):
        self.broker = broker
        self.peer_http_urls = peer_http_urls     # () -> {broker id: "http://host:port"}
        self.opener = opener or urllib.request.urlopen   # (url, timeout) -> response (with the broker's credentials)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="status-page")

    def snapshot(self) -> ClusterSnapshot:
        b = self.broker
        store = b.store
        try:
            live, controller = store.live_brokers(), store.get_controller_id()
        except Exception:   # ZooKeeper unreachable from here: this broker's last metadata says
            with b.metadata.lock:
                live, controller = dict(b.metadata.brokers), b.metadata.controller_id
        rows = []
        with b.metadata.lock:
            topics = [(name, entry.config, dict(entry.partitions)) for name, entry in sorted(b.metadata.topics.items())]
        default_min_isr = b.config.get("min.insync.replicas")
        for name, config, partitions in topics:
            min_isr = int(config.get("min.insync.replicas", default_min_isr))
            for p, s in sorted(partitions.items()):
                rows.append(PartitionRow(name, p, s.leader, list(s.replicas), list(s.isr), s.leader_epoch, min_isr,
                                         offline=s.leader < 0 or s.leader not in live))
        try:
            reassignments = store.get_reassignment()
        except Exception:
            reassignments = {}
        return ClusterSnapshot(b.broker_id, controller,
                               {i: f"{h}:{port}" for i, (h, port) in sorted(live.items())}, rows, reassignments)

    def fill_details(self, rows: list[PartitionRow]) -> None:
        """Ask each leader (in parallel, bounded) for its view of the rows it leads."""
        by_leader: dict[int, list[PartitionRow]] = {}
        for r in rows:
            if not r.offline:
                by_leader.setdefault(r.leader, []).append(r)
        urls = self.peer_http_urls() if any(l != self.broker.broker_id for l in by_leader) else {}

        def ask(leader: int, group: list[PartitionRow]) -> dict:
            tps = [(r.topic, r.partition) for r in group]
            if leader == self.broker.broker_id:
                return local_replicas(self.broker.replica_manager, tps)
            url = urls.get(leader)
            if not url:
                return {}
            query = urllib.parse.urlencode([("tp", f"{t}:{p}") for t, p in tps])
            with self.opener(f"{url}/replicas.json?{query}", timeout=PEER_TIMEOUT_S) as resp:
                return json.loads(resp.read())

        futures = {self.pool.submit(ask, leader, group): group for leader, group in by_leader.items()}
        for fut, group in futures.items():
            try:
                found = fut.result(timeout=PEER_TIMEOUT_S + 1)
            except Exception:
                continue   # that leader's cells show "?"
            for r in group:
                r.detail = found.get(f"{r.topic}:{r.partition}")

    def page(self, query_string: str) -> str:
        q = Query.parse(query_string)
        snap = self.snapshot()
        rows, matched = select_partitions(snap.rows, q)
        self.fill_details(rows)
        return render_html(snap, q, rows, matched)

    def page_json(self, query_string: str) -> dict:
        q = Query.parse(query_string)
        snap = self.snapshot()
        rows, matched = select_partitions(snap.rows, q)
        self.fill_details(rows)
        return {"broker_id": snap.broker_id, "controller_id": snap.controller_id,
                "brokers": {str(k): v for k, v in snap.brokers.items()},
                "under_replicated": sum(r.under_replicated for r in snap.rows),
                "offline": sum(r.offline for r in snap.rows), "matched": matched,
                "reassignments": [{"topic": t, "partition": p, "target": v}
                                  for (t, p), v in sorted(snap.reassignments.items())],
                "partitions": [{"topic": r.topic, "partition": r.partition, "leader": r.leader,
                                "replicas": r.replicas, "isr": r.isr, "state": r.css, "detail": r.detail}
                               for r in rows]}

    def close(self) -> None:
        self.pool.shutdown(wait=False)
