"""`replikafka cluster start --brokers N --dir D [--zookeeper H:P] [--secure]` / `stop --dir D` / `status --dir D`.

``--secure`` makes a throwaway CA and certificates in ``D/pki``, starts every
broker with an SSL (mTLS) and a SASL_SSL listener, ACLs and ZooKeeper ACLs
(replikafka.security.local_setup), and prints the client config to use."""
from __future__ import annotations

import os
import signal
import sys
import time

from replikafka.errors import InvalidConfigError, ReplikafkaError


def add_parser(sub, name):
    p = sub.add_parser(name, help="a local cluster: embedded ZooKeeper + N brokers in the background")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--dir", required=True, help="directory for the cluster's data, logs and state")
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (start)")
    p.add_argument("--zookeeper", default=None, help="use this ZooKeeper instead of an embedded one")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="broker config for every broker (repeatable)")
    p.add_argument("--secure", action="store_true",
                   help="start: TLS listeners (SSL + SASL_SSL), ACLs, ZooKeeper ACLs, with throwaway certificates")
    p.set_defaults(func=run)


def run(args) -> int:
    from replikafka.cluster_admin import parse_overrides
    from replikafka.local_cluster import LocalCluster, load_state, pid_alive

    if args.action == "start":
        if args.brokers < 1:
            raise InvalidConfigError(f"--brokers must be at least 1, got {args.brokers}")
        overrides = parse_overrides(args.override)
        security = None
        if args.secure:
            from replikafka.security.local_setup import SecureSetup
            security = SecureSetup(os.path.join(os.path.abspath(args.dir), "pki"))
        cluster = LocalCluster(args.dir, args.brokers, zookeeper_connect=args.zookeeper, overrides=overrides,
                               security=security)
        try:
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        # Detach: the processes outlive this command (they run in their own sessions).
        print(f"zookeeper: {cluster.zookeeper_connect}")
        print(f"bootstrap servers: {cluster.bootstrap_servers}")
        for bid in cluster.ids:
            print(f"broker {bid}: metrics {cluster.metrics_url(bid)}/metrics, status page {cluster.metrics_url(bid)}/")
        if security is not None:
            _print_secure(cluster, security)
        sys.stdout.flush()
        os._exit(0)
    state = load_state(args.dir)
    if args.action == "status":
        zk_pid = state.get("zookeeper_pid")
        if zk_pid:
            print(f"zookeeper: {state['zookeeper']} pid {zk_pid} {'up' if pid_alive(zk_pid) else 'down'}")
        else:
            print(f"zookeeper: {state['zookeeper']} (external)")
        for bid, b in sorted(state["brokers"].items(), key=lambda kv: int(kv[0])):
            print(f"broker {bid}: 127.0.0.1:{b['port']} pid {b['pid']} {'up' if pid_alive(b['pid']) else 'down'}"
                  + (f" metrics {b['metrics_url']}/metrics" if b.get("metrics_url") else ""))
        print(f"bootstrap servers: {state['bootstrap_servers']}")
        return 0
    # stop: brokers first (clean shutdown), then ZooKeeper
    pids = [b["pid"] for b in state["brokers"].values()]
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
    _wait_gone(pids, 30)
    zk_pid = state.get("zookeeper_pid")
    if zk_pid and pid_alive(zk_pid):
        os.kill(zk_pid, signal.SIGTERM)
        _wait_gone([zk_pid], 15)
    os.unlink(os.path.join(args.dir, "cluster.json"))
    print("cluster stopped")
    return 0


def _print_secure(cluster, security) -> None:
    files = security.write_client_properties()
    user, password = security.zk_digest
    print(f"SSL (mTLS) bootstrap servers: {cluster.bootstrap_for('SSL')}")
    print(f"SASL_SSL bootstrap servers: {cluster.bootstrap_for('SASL_SSL')}")
    print("super user User:admin; everyone else needs ACLs (replikafka acls)")
    print(f"client config as admin over SSL (certificate): {files['SSL']}")
    print(f"client config as admin over SASL_SSL (password): {files['SASL_SSL']}")
    for k, v in security.client_config("admin", "SSL").items():
        print(f"    {k}={v}")
    print("  use it with: replikafka topics --bootstrap-server "
          f"{cluster.bootstrap_for('SSL').split(',')[0]} --command-config {files['SSL']} --list")
    print(f"  in Python: replikafka.Admin({{'bootstrap.servers': ..., **properties}})")
    cert = security.user_certs["admin"]
    url = cluster.metrics_url(cluster.ids[0])
    print("metrics and status pages are HTTPS only; each request needs a principal with Describe on the cluster "
          "(POST /loggers: Alter), e.g. as admin by certificate or by password:")
    print(f"    curl --cacert {cert.ca} --cert {cert.certificate} --key {cert.key} {url}/metrics")
    print(f"    curl --cacert {cert.ca} --netrc-file {security.write_netrc('127.0.0.1')} {url}/status.json")
    print("  in a browser: import the CA, then sign in with a user's name and password (HTTP Basic)")
    print(f"ZooKeeper is secured (zookeeper.set.acl=true); for acls/configs/--zookeeper tools: "
          f"export REPLIKAFKA_ZK_DIGEST={user}:$(cat {security.zk_digest_file()})")


def _wait_gone(pids, timeout_s):
    from replikafka.local_cluster import pid_alive

    deadline = time.time() + timeout_s
    while any(pid_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    for p in pids:
        if pid_alive(p):
            os.kill(p, signal.SIGKILL)
