"""SCRAM credentials (RFC 5802/7677), stored as Kafka stores them.

A password is never stored: ``/config/users/<user>`` holds, per mechanism,
``salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>`` (Kafka's
ScramCredentialUtils format), where::

    SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)
    StoredKey      = H(HMAC(SaltedPassword, "Client Key"))
    ServerKey      = HMAC(SaltedPassword, "Server Key")

A broker verifies a password given over TLS by recomputing StoredKey with the
stored salt and iterations and comparing in constant time. Pure functions.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

from replikafka import errors as E

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
ITERATIONS_MIN = 4096          # Kafka's minimum (ScramMechanism.minIterations)
ITERATIONS_DEFAULT = 4096
SALT_BYTES = 32


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_config(self) -> str:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return (f"salt={b64(self.salt)},stored_key={b64(self.stored_key)},"
                f"server_key={b64(self.server_key)},iterations={self.iterations}")

    @staticmethod
    def from_config(text: str) -> "ScramCredential":
        try:
            parts = dict(p.split("=", 1) for p in text.split(","))
            return ScramCredential(base64.b64decode(parts["salt"]), base64.b64decode(parts["stored_key"]),
                                   base64.b64decode(parts["server_key"]), int(parts["iterations"]))
        except (ValueError, KeyError) as exc:
            raise E.InvalidConfigError(f"not a SCRAM credential ({exc})") from None


def _hash(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise E.InvalidConfigError(f"SCRAM mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)}") from None


def _keys(mechanism: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    h = _hash(mechanism)
    salted = hashlib.pbkdf2_hmac(h, password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    server_key = hmac.new(salted, b"Server Key", h).digest()
    return hashlib.new(h, client_key).digest(), server_key


def make_credential(mechanism: str, password: str, iterations: int = ITERATIONS_DEFAULT,
                    salt: bytes | None = None) -> ScramCredential:
    """A fresh salted credential for ``password``."""
    if not password:
        raise E.InvalidConfigError("a SCRAM password cannot be empty")
    if iterations < ITERATIONS_MIN:
        raise E.InvalidConfigError(f"SCRAM iterations {iterations} is below the minimum {ITERATIONS_MIN}")
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    stored_key, server_key = _keys(mechanism, password, salt, iterations)
    return ScramCredential(salt, stored_key, server_key, iterations)


def verify(mechanism: str, credential: ScramCredential, password: str) -> bool:
    stored_key, _ = _keys(mechanism, password, credential.salt, credential.iterations)
    return hmac.compare_digest(stored_key, credential.stored_key)


def parse_add_config(text: str) -> dict[str, dict[str, str]]:
    """``kafka-configs --add-config`` for users: ``SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=x]``
    -> ``{"SCRAM-SHA-256": {"iterations": "8192", "password": "alice-secret"}, ...}``.

    Values in brackets may contain commas; the mechanism names are checked."""
    out: dict[str, dict[str, str]] = {}
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            raise E.InvalidConfigError(f"--add-config: {text[i:]!r} is not key=value")
        key = text[i:eq].strip()
        if text.startswith("[", eq + 1):
            end = text.find("]", eq + 2)
            if end < 0:
                raise E.InvalidConfigError(f"--add-config: unclosed '[' after {key}=")
            body, i = text[eq + 2:end], end + 1
            fields: dict[str, str] = {}
            for item in body.split(","):
                k, sep, v = item.partition("=")
                if not sep:
                    raise E.InvalidConfigError(f"--add-config: {key}: {item!r} is not key=value")
                fields[k.strip()] = v
        else:
            end = text.find(",", eq + 1)
            end = n if end < 0 else end
            fields, i = {"value": text[eq + 1:end]}, end
        if key in MECHANISMS:
            unknown = set(fields) - {"password", "iterations"}
            if "password" not in fields or unknown:
                raise E.InvalidConfigError(f"--add-config: {key} takes [password=...,iterations=N]"
                                           + (f", not {sorted(unknown)}" if unknown else ""))
        out[key] = fields
        if i < n and text[i] == ",":
            i += 1
    return out
