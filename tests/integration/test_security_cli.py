"""`replikafka cluster start --secure` and the tools' `--command-config`, as a user types them."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def _cli(*args, env=None, input=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "replikafka", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, input=input)


def test_secure_local_cluster_and_command_config(tmp_path):
    d = str(tmp_path / "c")
    started = _cli("cluster", "start", "--secure", "--brokers", "1", "--dir", d)
    try:
        assert started.returncode == 0, started.stderr
        out = started.stdout
        ssl_bs = re.search(r"SSL \(mTLS\) bootstrap servers: (\S+)", out).group(1)
        sasl_bs = re.search(r"SASL_SSL bootstrap servers: (\S+)", out).group(1)
        ssl_props = re.search(r"over SSL \(certificate\): (\S+)", out).group(1)
        sasl_props = re.search(r"over SASL_SSL \(password\): (\S+)", out).group(1)
        zk = re.search(r"zookeeper: (\S+)", out).group(1)
        assert "sasl.password" not in out and "ssl.key.password" not in out
        # the metrics / status page URLs are https, and the printed curl lines work as printed
        assert re.search(r"broker 1: metrics https://127\.0\.0\.1:\d+/metrics, status page https://", out), out
        curls = [line.strip() for line in out.splitlines() if line.strip().startswith("curl ")]
        assert len(curls) == 2, out
        for line in curls:
            r = subprocess.run(line + " --fail --silent --show-error", shell=True, capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0 and ("kafka_server_" in r.stdout or '"brokers"' in r.stdout), (line, r.stderr)
        anonymous = re.sub(r" --(cert|key|netrc-file) \S+", "", curls[0])
        r = subprocess.run(anonymous + " --silent --write-out '%{http_code}'", shell=True, capture_output=True,
                           text=True, timeout=60)
        assert r.stdout.endswith("401") and "needs a principal" in r.stdout, r.stdout
        r = _cli("topics", "--bootstrap-server", ssl_bs, "--command-config", ssl_props, "--create",
                 "--topic", "t", "--partitions", "1", "--replication-factor", "1")
        assert r.returncode == 0, r.stderr
        r = _cli("console-producer", "--bootstrap-server", sasl_bs, "--command-config", sasl_props, "--topic", "t",
                 input="hello\nworld\n")
        assert r.returncode == 0, r.stderr
        r = _cli("console-consumer", "--bootstrap-server", ssl_bs, "--command-config", ssl_props, "--topic", "t",
                 "--from-beginning", "--max-messages", "2", "--timeout-ms", "20000")
        assert r.returncode == 0 and r.stdout.split() == ["hello", "world"], r.stderr
        # without the config: refused, one line naming the cause
        r = _cli("topics", "--bootstrap-server", ssl_bs, "--list")
        assert r.returncode == 1 and "speaks TLS but security.protocol is PLAINTEXT" in r.stderr
        assert "Traceback" not in r.stderr
        # a user created with configs, given an ACL, reads over SASL_SSL
        with open(os.path.join(d, "pki", "zookeeper-digest-password")) as f:
            env = {"REPLIKAFKA_ZK_DIGEST": "kafka:" + f.read()}
        r = _cli("configs", "--zookeeper", zk, "--entity-type", "users", "--entity-name", "carol", "--alter",
                 "--add-config", "SCRAM-SHA-512=[password=carol-secret]", env=env)
        assert r.returncode == 0, r.stderr
        carol = tmp_path / "carol.properties"
        ca = os.path.join(d, "pki", "ca.pem")
        carol.write_text(f"security.protocol=SASL_SSL\nssl.ca.location={ca}\nsasl.mechanism=SCRAM-SHA-512\n"
                         f"sasl.username=carol\nsasl.password=carol-secret\n")
        read = ("console-consumer", "--bootstrap-server", sasl_bs, "--command-config", str(carol), "--topic", "t",
                "--from-beginning", "--max-messages", "2", "--timeout-ms", "20000")
        r = _cli(*read)
        assert r.returncode == 1 and "TOPIC_AUTHORIZATION_FAILED" in r.stderr, (r.stdout, r.stderr)
        r = _cli("acls", "--zookeeper", zk, "--add", "--allow-principal", "User:carol", "--consumer", "--topic", "t",
                 env=env)
        assert r.returncode == 0, r.stderr
        r = _cli(*read)
        assert r.returncode == 0 and r.stdout.split() == ["hello", "world"], r.stderr
    finally:
        stopped = _cli("cluster", "stop", "--dir", d)
        assert stopped.returncode == 0, stopped.stderr
