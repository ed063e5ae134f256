"""`replikafka topics`, `console-producer` and `console-consumer` against the
in-process fake broker: output layout, flag checks, exit codes."""
import io
import sys

import pytest

from replikafka.cli.main import main


def run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_topics_create_list_describe_alter_delete(fake, capsys):
    bs = fake.bootstrap
    rc, out, err = run(capsys, "topics", "--bootstrap-server", bs, "--create", "--topic", "t", "--partitions", "2",
                       "--replication-factor", "2", "--config", "retention.ms=5", "--config", "segment.bytes=9")
    assert rc == 0 and "Created topic t." in out, err
    assert fake.topics["t"].config == {"retention.ms": "5", "segment.bytes": "9"}
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--create", "--topic", "s", "--partitions", "1",
                     "--replication-factor", "1", "--schema", "id BIGINT, name STRING")
    assert rc == 0
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--list")
    assert out.split() == ["s", "t"]
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--describe", "--topic", "t")
    lines = out.splitlines()
    assert lines[0].startswith("Topic: t\tPartitionCount: 2\tReplicationFactor: 2\tConfigs: ")
    assert lines[1].startswith("\tTopic: t\tPartition: 0\tLeader: 1\tReplicas: 1,2\tIsr: 1,2")
    assert lines[2].startswith("\tTopic: t\tPartition: 1\tLeader: 2\tReplicas: 1,2\tIsr: 1,2")
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--describe")
    assert "Schema: id int64, name string" in out and out.count("Partition: ") == 3
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--describe", "--under-replicated-partitions")
    assert rc == 0 and out == ""
    fake.topics["t"].partitions[1].leader = -1
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--describe", "--unavailable-partitions")
    assert out.strip().startswith("Topic: t\tPartition: 1\tLeader: none")
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--alter", "--topic", "t", "--partitions", "4")
    assert rc == 0 and len(fake.topics["t"].partitions) == 4
    rc, out, _ = run(capsys, "topics", "--bootstrap-server", bs, "--delete", "--topic", "t")
    assert rc == 0 and "t" not in fake.topics


@pytest.mark.parametrize("argv, named", [
    (["--list", "--create"], "exactly one"),
    ([], "exactly one"),
    # --partitions / --replication-factor may be left out (the brokers' defaults), as in Kafka 3.x
    (["--create", "--topic", "x", "--partitions", "0", "--replication-factor", "1"], "--partitions"),
    (["--create", "--topic", "x", "--partitions", "1", "--replica-assignment", "1:2"], "--replica-assignment"),
    (["--create", "--topic", "x", "--replica-assignment", "1:a"], "--replica-assignment"),
    (["--create", "--topic", "x", "--replica-assignment", "1:2,3"], "same number of replicas"),
    (["--list", "--topics-with-overrides"], "--topics-with-overrides"),
    (["--create", "--partitions", "1", "--replication-factor", "1"], "--topic"),
    (["--delete"], "--topic"),
    (["--alter", "--topic", "x"], "--partitions"),
    (["--list", "--partitions", "3"], "--partitions"),
    (["--describe", "--config", "a=b"], "--config"),
    (["--create", "--topic", "x", "--partitions", "1", "--replication-factor", "1", "--config", "novalue"],
     "KEY=VALUE"),
])
def test_topics_bad_flag_combinations(fake, capsys, argv, named):
    rc, out, err = run(capsys, "topics", "--bootstrap-server", fake.bootstrap, *argv)
    assert rc == 2 and named in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_topics_needs_a_server(capsys):
    rc, _, err = run(capsys, "topics", "--list")
    assert rc == 2 and "--bootstrap-server" in err


def test_topics_server_errors_are_one_line(fake, capsys):
    fake.add_topic("t", 1)
    rc, _, err = run(capsys, "topics", "--bootstrap-server", fake.bootstrap, "--create", "--topic", "t",
                     "--partitions", "1", "--replication-factor", "1")
    assert rc == 1 and "TOPIC_ALREADY_EXISTS" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run(capsys, "topics", "--bootstrap-server", fake.bootstrap, "--create", "--topic", "t",
                     "--partitions", "1", "--replication-factor", "1", "--if-not-exists")
    assert rc == 0
    rc, _, err = run(capsys, "topics", "--bootstrap-server", fake.bootstrap, "--describe", "--topic", "nope")
    assert rc == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err


def test_console_round_trip_kafka_shaped(fake, capsys, monkeypatch):
    fake.add_topic("t", 2)
    bs = fake.bootstrap
    rc, _, err = run(capsys, "console-producer", "--bootstrap-server", bs, "--topic", "t",
                     stdin=b"one\ntwo\r\n\xff\xfebad\nlast", monkeypatch=monkeypatch)
    assert rc == 0, err
    rc, _, err = run(capsys, "console-producer", "--bootstrap-server", bs, "--topic", "t", "--property",
                     "parse.key=true", "--property", "key.separator=:", stdin=b"k1:v1\nk2:v:2\n",
                     monkeypatch=monkeypatch)
    assert rc == 0, err
    rc, out, err = run(capsys, "console-consumer", "--bootstrap-server", bs, "--topic", "t", "--from-beginning",
                       "--max-messages", "6", "--timeout-ms", "3000")
    assert rc == 0 and "Processed a total of 6 messages" in err
    assert sorted(out.splitlines()) == sorted(["one", "two", "\ufffd\ufffdbad", "last", "v1", "v:2"])
    rc, out, err = run(capsys, "console-consumer", "--bootstrap-server", bs, "--topic", "t", "--from-beginning",
                       "--timeout-ms", "300", "--property", "print.key=true,print.offset=true,print.partition=true")
    keyed = [ln for ln in out.splitlines() if ln.endswith("\tk1\tv1")]
    assert len(keyed) == 1 and keyed[0].startswith("Partition:") and "\tOffset:" in keyed[0]
    rc, out, err = run(capsys, "console-consumer", "--bootstrap-server", bs, "--topic", "t", "--timeout-ms", "200")
    assert rc == 0 and out == ""  # starts at the end by default


def test_console_round_trip_schema_topic(fake, capsys, monkeypatch):
    import pyarrow as pa
    fake.add_topic("s", 1, pa.schema([("id", pa.int64()), ("name", pa.string())]))
    bs = fake.bootstrap
    rc, _, err = run(capsys, "console-producer", "--bootstrap-server", bs, "--topic", "s",
                     stdin=b'{"id": 1, "name": "a"}\n{"id": 2}\n', monkeypatch=monkeypatch)
    assert rc == 0, err
    rc, out, _ = run(capsys, "console-consumer", "--bootstrap-server", bs, "--topic", "s", "--partition", "0",
                     "--offset", "1", "--max-messages", "1")
    assert out.splitlines() == ['{"id": 2, "name": null}']
    rc, _, err = run(capsys, "console-producer", "--bootstrap-server", bs, "--topic", "s",
                     stdin=b'not json\n', monkeypatch=monkeypatch)
    assert rc == 1 and "line 1" in err
    rc, _, err = run(capsys, "console-producer", "--bootstrap-server", bs, "--topic", "s",
                     stdin=b'{"id": "zz"}\n', monkeypatch=monkeypatch)
    assert rc == 1 and "'id'" in err


@pytest.mark.parametrize("argv, named", [
    (["--offset", "3"], "--partition"),
    (["--partition", "0", "--offset", "x"], "--offset"),
    (["--max-messages", "0"], "--max-messages"),
    (["--property", "print.colour=true"], "print.colour"),
])
def test_console_consumer_bad_flags(fake, capsys, argv, named):
    rc, _, err = run(capsys, "console-consumer", "--bootstrap-server", fake.bootstrap, "--topic", "t", *argv)
    assert rc == 2 and named in err


def test_console_tools_on_unknown_topic(fake, capsys, monkeypatch):
    rc, _, err = run(capsys, "console-consumer", "--bootstrap-server", fake.bootstrap, "--topic", "nope",
                     "--max-messages", "1")
    assert rc == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err
    rc, _, err = run(capsys, "console-producer", "--bootstrap-server", fake.bootstrap, "--topic", "nope",
                     stdin=b"x\n", monkeypatch=monkeypatch)
    assert rc == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err


def test_missing_key_separator_is_reported(fake, capsys, monkeypatch):
    fake.add_topic("t", 1)
    rc, _, err = run(capsys, "console-producer", "--bootstrap-server", fake.bootstrap, "--topic", "t",
                     "--property", "parse.key=true", stdin=b"a\tb\nnokey\n", monkeypatch=monkeypatch)
    assert rc == 1 and "line 2" in err


def test_command_config_is_a_kafka_client_properties_file(fake, capsys, tmp_path, caplog):
    fake.add_topic("t", 1)
    props = tmp_path / "client.properties"
    props.write_text("request.timeout.ms=5000\nclient.id=ops\n")
    rc, out, err = run(capsys, "topics", "--bootstrap-server", fake.bootstrap, "--list", "--command-config", str(props))
    assert rc == 0 and out.split() == ["t"], err
    assert "ignoring Kafka client config keys that do not apply here: client.id" in caplog.text
    props.write_text("request.timeout.mss=5000\n")
    rc, out, err = run(capsys, "topics", "--bootstrap-server", fake.bootstrap, "--list", "--command-config", str(props))
    assert rc == 1 and "did you mean request.timeout.ms" in err, err
