"""The HTTP port's security pieces that need no broker: the Basic header, the
operation each request needs, and the metrics.listener schemes."""
import base64

import pytest

from replikafka import errors as E
from replikafka.broker.config import BrokerConfig, http_listener_address
from replikafka.broker.http_security import basic_credentials, operation_of


def _basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


def test_basic_credentials_are_parsed_or_refused_naming_the_problem():
    assert basic_credentials(_basic("alice:pa:ss")) == ("alice", "pa:ss")
    assert basic_credentials("basic " + base64.b64encode(b"bob:").decode()) == ("bob", "")
    for header, why in [("Bearer abc", "'Bearer' is not supported"), (_basic("nocolon"), "user:password"),
                        ("Basic !!!", "not base64"), (_basic(":pw"), "user:password")]:
        with pytest.raises(E.SaslAuthenticationFailedError, match=why):
            basic_credentials(header)


def test_reads_need_describe_and_changing_log_levels_needs_alter():
    assert operation_of("POST", "/loggers") == "Alter"
    for method, path in [("GET", "/loggers"), ("GET", "/metrics"), ("GET", "/"), ("GET", "/status.json"),
                         ("GET", "/replicas.json"), ("POST", "/metrics"), ("GET", "/nope")]:
        assert operation_of(method, path) == "Describe", (method, path)


def test_metrics_listener_takes_http_or_https():
    base = {"broker.id": 1, "zookeeper.connect": "z:1"}
    cfg = BrokerConfig.from_dict({**base, "metrics.listener": "HTTPS://127.0.0.1:0"})
    assert cfg.get("metrics.listener") == "https://127.0.0.1:0"
    assert http_listener_address(cfg.get("metrics.listener")) == ("https", "127.0.0.1", 0)
    assert http_listener_address("http://[::1]:9404") == ("http", "::1", 9404)
    with pytest.raises(E.InvalidConfigError, match="https://host:port"):
        BrokerConfig.from_dict({**base, "metrics.listener": "ftp://h:1"})
