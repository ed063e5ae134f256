"""A throwaway secure set-up for a local cluster (``replikafka cluster start --secure``,
the tests): a CA, one certificate for the brokers and one per client user,
SCRAM credentials for the users, the brokers' ZooKeeper identity, and the
broker and client configs that use them.

Every broker gets two listeners: ``SSL`` (mTLS, ``ssl.client.auth=required``,
also the inter-broker listener) and ``SASL_SSL`` (username/password over TLS).
Brokers authenticate as ``User:broker`` (their certificate's CN) and are super
users together with ``User:admin``; everyone else needs ACLs
(``allow.everyone.if.no.acl.found=false``). ZooKeeper znodes are written with
``zookeeper.set.acl=true`` by the digest user ``kafka``.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from replikafka.security.certs import CertFiles, CertificateAuthority

BROKER_CN = "broker"
ADMIN = "admin"
ZK_USER = "kafka"


@dataclass
class SecureSetup:
    directory: str
    users: tuple[str, ...] = (ADMIN,)
    ca: CertificateAuthority = field(init=False)
    broker_cert: CertFiles = field(init=False)
    user_certs: dict[str, CertFiles] = field(init=False)
    passwords: dict[str, str] = field(init=False)
    zk_password: str = field(init=False)

    def __post_init__(self):
        os.makedirs(self.directory, exist_ok=True)
        self.ca = CertificateAuthority(self.directory)
        self.broker_cert = self.ca.issue(BROKER_CN, key_password=secrets.token_hex(8))
        users = tuple(dict.fromkeys((ADMIN,) + tuple(self.users)))
        self.users = users
        self.user_certs = {u: self.ca.issue(u) for u in users}
        self.passwords = {u: secrets.token_urlsafe(12) for u in users}
        self.zk_password = secrets.token_urlsafe(12)

    @property
    def zk_digest(self) -> tuple[str, str]:
        return ZK_USER, self.zk_password

    def broker_overrides(self) -> dict[str, str]:
        """Broker keys (besides ``listeners``, which the cluster assigns ports to)."""
        c = self.broker_cert
        return {"security.inter.broker.protocol": "SSL",
                "ssl.ca.location": c.ca, "ssl.certificate.location": c.certificate,
                "ssl.key.location": c.key, "ssl.key.password": c.key_password or "",
                "ssl.client.auth": "required",
                "authorizer.class.name": "AclAuthorizer",
                "super.users": f"User:{BROKER_CN};User:{ADMIN}",
                "allow.everyone.if.no.acl.found": "false",
                "zookeeper.set.acl": "true",
                "zookeeper.digest.username": ZK_USER, "zookeeper.digest.password": self.zk_password}

    def client_config(self, user: str = ADMIN, protocol: str = "SSL") -> dict[str, str]:
        """librdkafka-style keys for ``user`` over ``protocol`` (SSL: its certificate; SASL_SSL: its password)."""
        if protocol == "SSL":
            c = self.user_certs[user]
            return {"security.protocol": "SSL", "ssl.ca.location": c.ca,
                    "ssl.certificate.location": c.certificate, "ssl.key.location": c.key}
        return {"security.protocol": "SASL_SSL", "ssl.ca.location": self.ca.ca_path,
                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": self.passwords[user]}

    def write_client_properties(self, user: str = ADMIN) -> dict[str, str]:
        """``client-<user>-ssl.properties`` and ``client-<user>-sasl.properties`` (for ``--command-config``)."""
        out = {}
        for protocol, suffix in (("SSL", "ssl"), ("SASL_SSL", "sasl")):
            path = os.path.join(self.directory, f"client-{user}-{suffix}.properties")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                for k, v in self.client_config(user, protocol).items():
                    f.write(f"{k}={v}\n")
            out[protocol] = path
        return out

    def write_netrc(self, host: str, user: str = ADMIN) -> str:
        """A 0600 netrc file with ``user``'s password for ``host`` (``curl --netrc-file``: the
        password stays off the command line and the terminal)."""
        path = os.path.join(self.directory, f"{user}.netrc")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"machine {host} login {user} password {self.passwords[user]}\n")
        return path

    def zk_digest_file(self) -> str:
        """A 0600 file holding the ZooKeeper digest password (not printed to the terminal)."""
        path = os.path.join(self.directory, "zookeeper-digest-password")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.zk_password)
        return path

    def prepare_zookeeper(self, zk) -> None:
        """Store the users' SCRAM credentials (readable by brokers only) before brokers start."""
        from replikafka.security import scram
        from replikafka.security.zk_security import CredentialStore, sensitive_acl
        store = CredentialStore(zk, sensitive_acl(ZK_USER, self.zk_password))
        for user, password in self.passwords.items():
            store.alter(user, {m: scram.make_credential(m, password) for m in scram.MECHANISMS})
