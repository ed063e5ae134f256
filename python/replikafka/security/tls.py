"""TLS and credentials on gRPC channels, with Kafka's and librdkafka's key names.

Server side: :func:`server_credentials` turns a listener's PEM files into
``grpc.ssl_server_credentials``; :class:`PrincipalMapper` applies
``ssl.principal.mapping.rules`` to a peer certificate's subject;
:func:`principal_of` reads a call's principal from gRPC's auth context (mTLS)
or its ``authorization`` metadata (SASL_SSL, verified by the caller's hook).

Client side: :class:`ClientSecurity` is built from a librdkafka-style dict
(``security.protocol``, ``ssl.ca.location``, ``ssl.certificate.location``,
``ssl.key.location``, ``ssl.key.password``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password``) and opens channels. Credentials ride on
gRPC's access-token call credentials, which gRPC sends only over TLS, so a
password can never leave on a plaintext connection. When a TLS connection
fails, :func:`diagnose` repeats the handshake with Python's ``ssl`` module to
name the cause (untrusted CA, expired certificate, plaintext port, missing
client certificate).
"""
from __future__ import annotations

import base64
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any, Mapping

import grpc

from replikafka import errors as E

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
CLIENT_AUTH = ("required", "none")   # see _check_client_auth for "requested"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_TOKEN_PREFIX = "rk-sasl "
DIAGNOSE_TIMEOUT_S = 3.0
CLIENT_KEYS = ("security.protocol", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
               "ssl.key.password", "sasl.mechanism", "sasl.username", "sasl.password")
SECRET_KEYS = ("ssl.key.password", "sasl.password")


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise E.InvalidConfigError(f"{key}: cannot read {path!r}: {exc.strerror}") from None


def _key_bytes(path: str, password: str | None) -> bytes:
    from replikafka.security.certs import decrypted_key_pem
    _read(path, "ssl.key.location")
    try:
        return decrypted_key_pem(path, password or None)
    except (ValueError, TypeError) as exc:
        raise E.InvalidConfigError(f"ssl.key.location {path!r} cannot be loaded"
                                   f"{' with ssl.key.password' if password else ''}: {exc}") from None


def check_not_expired(path: str, key: str = "ssl.certificate.location") -> None:
    import datetime as dt
    from replikafka.security.certs import certificate_expiry
    try:
        end = certificate_expiry(path)
    except ValueError as exc:
        raise E.InvalidConfigError(f"{key} {path!r} is not a PEM certificate: {exc}") from None
    if end < dt.datetime.now(dt.timezone.utc):
        raise E.SslAuthenticationError(f"{key} {path!r}: the certificate expired on {end:%Y-%m-%d %H:%M} UTC")


def _check_client_auth(value: str) -> str:
    value = value.strip().lower()
    if value == "requested":
        raise E.InvalidConfigError(
            "ssl.client.auth=requested: gRPC's TLS can require a client certificate or not ask for one, "
            "but not ask for an optional one; use required (mTLS) or none")
    if value not in CLIENT_AUTH:
        raise E.InvalidConfigError(f"ssl.client.auth {value!r} is not one of required, none")
    return value


def server_credentials(ca: str, certificate: str, key: str, key_password: str | None,
                       client_auth: str) -> grpc.ServerCredentials:
    """gRPC's TLS for one listener; ``client_auth=required`` verifies client certificates against ``ca``."""
    for path, name in ((certificate, "ssl.certificate.location"), (key, "ssl.key.location")):
        if not path:
            raise E.InvalidConfigError(f"a TLS listener needs {name}")
    check_not_expired(certificate)
    required = _check_client_auth(client_auth) == "required"
    if required and not ca:
        raise E.InvalidConfigError("ssl.client.auth=required needs ssl.ca.location (the CA clients are signed by)")
    return grpc.ssl_server_credentials([(_key_bytes(key, key_password), _read(certificate, "ssl.certificate.location"))],
                                       root_certificates=_read(ca, "ssl.ca.location") if ca else None,
                                       require_client_auth=required)


# ---- principals ------------------------------------------------------------------
_RULE = re.compile(r"RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU])?")


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules``: ``RULE:pattern/replacement/[LU]`` entries
    separated by commas, then ``DEFAULT`` (the whole distinguished name). The first
    rule whose pattern matches the subject (``CN=alice,O=acme``) gives the name."""

    def __init__(self, rules: str):
        self.rules: list[tuple[re.Pattern | None, str, str]] = []
        text = rules.strip()
        while text:
            if text.startswith("DEFAULT"):
                self.rules.append((None, "", ""))
                text = text[len("DEFAULT"):]
            else:
                m = _RULE.match(text)
                if not m:
                    raise E.InvalidConfigError(f"ssl.principal.mapping.rules: cannot parse {text!r} "
                                               f"(expected RULE:pattern/replacement/[LU] or DEFAULT)")
                try:
                    pattern = re.compile(m.group(1).replace("\\/", "/"))
                except re.error as exc:
                    raise E.InvalidConfigError(f"ssl.principal.mapping.rules: bad pattern {m.group(1)!r}: {exc}") from None
                self.rules.append((pattern, m.group(2).replace("\\/", "/"), m.group(3) or ""))
                text = text[m.end():]
            text = text.strip()
            if text.startswith(","):
                text = text[1:].strip()
            elif text:
                raise E.InvalidConfigError(f"ssl.principal.mapping.rules: expected ',' before {text!r}")
        if not self.rules:
            self.rules.append((None, "", ""))

    def name_of(self, subject: str) -> str:
        for pattern, replacement, case in self.rules:
            if pattern is None:
                return subject
            m = pattern.fullmatch(subject)
            if m:
                name = m.expand(re.sub(r"\$(\d)", r"\\\1", replacement))
                return name.lower() if case == "L" else name.upper() if case == "U" else name
        return subject


def subject_of(auth_context: Mapping[str, list[bytes]]) -> str | None:
    """The verified peer certificate's subject (``CN=alice,O=acme``), or None without one."""
    values = auth_context.get("x509_subject")
    return values[0].decode() if values else None


def encode_sasl_token(mechanism: str, username: str, password: str) -> str:
    """The bearer token a SASL_SSL client sends on every call (over TLS only)."""
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    return f"{mechanism} {b64(username)} {b64(password)}"


def decode_sasl_token(value: str) -> tuple[str, str, str]:
    """``authorization`` metadata -> (mechanism, username, password), or a SASL error."""
    text = value[len("Bearer "):] if value.startswith("Bearer ") else value
    try:
        mechanism, user, password = text.split(" ")
        return mechanism, base64.b64decode(user, validate=True).decode(), base64.b64decode(password, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise E.SaslAuthenticationFailedError("the authorization metadata is not a SASL credential") from None


# ---- clients ---------------------------------------------------------------------
@dataclass(frozen=True)
class ClientSecurity:
    """How a client (or a broker talking to another broker) connects."""
    protocol: str = "PLAINTEXT"
    ca: str = ""
    certificate: str = ""
    key: str = ""
    key_password: str = field(default="", repr=False)
    sasl_mechanism: str = "PLAIN"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)

    @staticmethod
    def from_config(config: Mapping[str, Any] | None) -> "ClientSecurity":
        """From librdkafka-style keys; unknown ``ssl.``/``sasl.`` keys are named in the error."""
        cfg = {k: ("" if v is None else str(v)) for k, v in (config or {}).items()}
        for k in cfg:
            if (k.startswith("ssl.") or k.startswith("sasl.")) and k not in CLIENT_KEYS \
                    and k not in ("ssl.endpoint.identification.algorithm",):
                raise E.InvalidConfigError(f"unknown security config {k!r} (known: {', '.join(CLIENT_KEYS)})")
        check = cfg.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
        if check != "https":
            raise E.InvalidConfigError(f"ssl.endpoint.identification.algorithm={check or 'none'}: gRPC's TLS always "
                                       f"checks that the broker's certificate names its host; only https is possible")
        protocol = cfg.get("security.protocol", "PLAINTEXT").strip().upper() or "PLAINTEXT"
        if protocol == "SASL_PLAINTEXT":
            raise E.InvalidConfigError("security.protocol=SASL_PLAINTEXT would send the password in clear; "
                                       "use SASL_SSL")
        if protocol not in PROTOCOLS:
            raise E.InvalidConfigError(f"security.protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
        mechanism = cfg.get("sasl.mechanism", "PLAIN").strip().upper() or "PLAIN"
        if mechanism not in SASL_MECHANISMS:
            raise E.InvalidConfigError(f"sasl.mechanism {mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}")
        sec = ClientSecurity(protocol, cfg.get("ssl.ca.location", ""), cfg.get("ssl.certificate.location", ""),
                             cfg.get("ssl.key.location", ""), cfg.get("ssl.key.password", ""), mechanism,
                             cfg.get("sasl.username", ""), cfg.get("sasl.password", ""))
        if protocol == "SASL_SSL" and not (sec.sasl_username and sec.sasl_password):
            raise E.InvalidConfigError("security.protocol=SASL_SSL needs sasl.username and sasl.password")
        if bool(sec.certificate) != bool(sec.key):
            raise E.InvalidConfigError("ssl.certificate.location and ssl.key.location go together")
        if sec.certificate:
            check_not_expired(sec.certificate)
        return sec

    @property
    def tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """gRPC credentials for this protocol (None for PLAINTEXT)."""
        if not self.tls:
            return None
        creds = grpc.ssl_channel_credentials(
            _read(self.ca, "ssl.ca.location") if self.ca else None,
            _key_bytes(self.key, self.key_password) if self.key else None,
            _read(self.certificate, "ssl.certificate.location") if self.certificate else None)
        if self.protocol == "SASL_SSL":
            token = encode_sasl_token(self.sasl_mechanism, self.sasl_username, self.sasl_password)
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return creds

    def channel(self, target: str, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
        creds = self.channel_credentials()
        if creds is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, creds, options=options)

    def flight_client_options(self) -> dict:
        """Keyword arguments for ``pyarrow.flight.FlightClient`` (TLS roots, client certificate)
        and the scheme to use: ``{"scheme": "grpc+tls", "tls_root_certs": ..., ...}``."""
        if not self.tls:
            return {"scheme": "grpc+tcp"}
        out: dict = {"scheme": "grpc+tls"}
        if self.ca:
            out["tls_root_certs"] = _read(self.ca, "ssl.ca.location")
        if self.certificate:
            out["cert_chain"] = _read(self.certificate, "ssl.certificate.location")
            out["private_key"] = _key_bytes(self.key, self.key_password)
        return out

    def flight_headers(self) -> list[tuple[bytes, bytes]]:
        """Headers every Flight call carries (SASL_SSL: the credentials, sent only over TLS)."""
        if self.protocol != "SASL_SSL":
            return []
        token = encode_sasl_token(self.sasl_mechanism, self.sasl_username, self.sasl_password)
        return [(b"authorization", f"Bearer {token}".encode())]

    def https_context(self) -> ssl.SSLContext:
        """Python's TLS client context for a broker's HTTPS port (``metrics.listener``): the CA
        in ssl.ca.location (else the system's), and the client certificate when there is one."""
        ctx = ssl.create_default_context(cafile=self.ca or None)
        if self.certificate:
            try:
                ctx.load_cert_chain(self.certificate, self.key, password=self.key_password or None)
            except (ssl.SSLError, OSError) as exc:
                raise E.InvalidConfigError(f"ssl.certificate.location/ssl.key.location cannot be loaded: {exc}") from None
        return ctx

    def http_headers(self) -> dict[str, str]:
        """Headers every HTTPS request carries (SASL_SSL: HTTP Basic with the username and password)."""
        if self.protocol != "SASL_SSL":
            return {}
        pair = base64.b64encode(f"{self.sasl_username}:{self.sasl_password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}

    def redacted(self) -> dict[str, str]:
        """The settings with secrets masked (for logs and plan strings)."""
        return {"security.protocol": self.protocol, "ssl.ca.location": self.ca,
                "ssl.certificate.location": self.certificate, "ssl.key.location": self.key,
                "ssl.key.password": "[hidden]" if self.key_password else "",
                "sasl.mechanism": self.sasl_mechanism, "sasl.username": self.sasl_username,
                "sasl.password": "[hidden]" if self.sasl_password else ""}


PLAINTEXT = ClientSecurity()


def diagnose(target: str, security: ClientSecurity, timeout_s: float = DIAGNOSE_TIMEOUT_S) -> str | None:
    """Why a connection to ``target`` fails at the TLS level, in words, or None if the
    handshake (and the server's first answer) is fine or the broker is not reachable
    (or does not answer within ``timeout_s`` per step)."""
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError:
        return None
    try:
        if not security.tls:
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
            try:
                with probe.wrap_socket(sock, server_hostname=host):
                    return (f"the broker at {target} speaks TLS but security.protocol is PLAINTEXT; "
                            f"use security.protocol=SSL or SASL_SSL")
            except (ssl.SSLError, OSError):
                return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.set_alpn_protocols(["h2"])
        if security.ca:
            ctx.load_verify_locations(security.ca)
        else:
            ctx.load_default_certs()
        if security.certificate:
            ctx.load_cert_chain(security.certificate, security.key, password=security.key_password or None)
        try:
            with ctx.wrap_socket(sock, server_hostname=host) as tls:
                tls.settimeout(0.5)
                try:
                    tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                    if tls.recv(1) == b"":   # TLS 1.3: the server checks our certificate after the handshake
                        if security.certificate:
                            return (f"the broker at {target} does not trust our client certificate "
                                    f"(ssl.certificate.location is not signed by a CA it trusts, or has expired)")
                        return (f"the broker at {target} requires a client certificate "
                                f"(set ssl.certificate.location and ssl.key.location)")
                except ssl.SSLError as exc:
                    if "CERTIFICATE_REQUIRED" in exc.reason or "certificate required" in str(exc):
                        return (f"the broker at {target} requires a client certificate "
                                f"(set ssl.certificate.location and ssl.key.location)")
                    return f"TLS with {target} failed: {exc.reason or exc}"
                except (socket.timeout, OSError):
                    pass
                return None
        except ssl.SSLCertVerificationError as exc:
            hint = {"certificate has expired": "the broker's certificate has expired",
                    "unable to get local issuer certificate":
                        "the broker's certificate is not signed by the CA in ssl.ca.location",
                    "self-signed certificate in certificate chain":
                        "the broker's certificate is not signed by the CA in ssl.ca.location"}
            msg = exc.verify_message or str(exc)
            return f"TLS with {target}: {hint.get(msg, msg)} ({msg})"
        except ssl.SSLError as exc:
            reason = exc.reason or str(exc)
            if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNEXPECTED_EOF_WHILE_READING") \
                    or "wrong version number" in str(exc):
                return f"the broker at {target} does not speak TLS (a PLAINTEXT listener?); check security.protocol"
            if "CERTIFICATE_EXPIRED" in reason or "certificate expired" in str(exc):
                return f"the broker at {target} refused our client certificate: it has expired"
            if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason or "unknown ca" in str(exc):
                return f"the broker at {target} does not trust our client certificate ({reason})"
            return f"TLS with {target} failed: {reason}"
        except TimeoutError:
            return None   # a hung broker (e.g. stopped) is unavailable, not a TLS problem: try the next
        except OSError as exc:
            return f"TLS with {target} failed: {exc}"
    finally:
        sock.close()
