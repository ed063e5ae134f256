"""``--command-config FILE`` for the command-line tools, as Kafka's tools take it:
a properties file of client keys, here the security ones (``security.protocol``,
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``,
``ssl.key.password``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``)."""
from __future__ import annotations

from replikafka import errors as E


def add_argument(parser) -> None:
    parser.add_argument("--command-config", metavar="FILE",
                        help="client properties (security.protocol, ssl.*, sasl.*), as Kafka's tools")


def client_config_of(args, bootstrap: str, **settings) -> dict[str, str]:
    """A Kafka-style client config dict: ``bootstrap.servers``, then every key of
    ``--command-config`` (security keys go to the TLS/SASL set-up; other client
    keys such as ``request.timeout.ms`` are honoured, Kafka's inapplicable ones
    warned about, unknown ones refused with did-you-mean), then ``settings``."""
    return {"bootstrap.servers": bootstrap, **(security_of(args) or {}), **settings}


def security_of(args) -> dict[str, str] | None:
    """The security keys of ``--command-config`` (None without one); an unknown key is named."""
    path = getattr(args, "command_config", None)
    if not path:
        return None
    from replikafka.cluster_admin import read_properties
    from replikafka.security.tls import ClientSecurity
    try:
        props = read_properties(path)
    except OSError as exc:
        raise E.InvalidConfigError(f"--command-config: cannot read {path!r}: {exc.strerror}") from None
    ClientSecurity.from_config(props)   # names an unknown or bad key now, before any connection
    return props
