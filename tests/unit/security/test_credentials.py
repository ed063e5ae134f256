"""SCRAM credentials, the principal mapping rules, client security config."""
import pytest

from replikafka import errors as E
from replikafka.security import scram
from replikafka.security.tls import ClientSecurity, PrincipalMapper, decode_sasl_token, encode_sasl_token


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_credential_verifies_only_its_password(mech):
    cred = scram.make_credential(mech, "s3cret", iterations=4096)
    assert scram.verify(mech, cred, "s3cret")
    assert not scram.verify(mech, cred, "s3cret ")
    text = cred.to_config()
    assert "s3cret" not in text and text.startswith("salt=") and text.endswith("iterations=4096")
    assert scram.ScramCredential.from_config(text) == cred
    # salted: the same password gives a different stored key each time
    assert scram.make_credential(mech, "s3cret").stored_key != cred.stored_key


def test_scram_rfc7677_vector():
    # RFC 7677 section 3: user/pencil, salt W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations
    import base64
    cred = scram.make_credential("SCRAM-SHA-256", "pencil", 4096, base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    assert base64.b64encode(cred.server_key).decode() == "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="


def test_scram_rejects_weak_settings():
    with pytest.raises(E.InvalidConfigError, match="below the minimum 4096"):
        scram.make_credential("SCRAM-SHA-256", "x", iterations=100)
    with pytest.raises(E.InvalidConfigError, match="SCRAM-SHA-1"):
        scram.make_credential("SCRAM-SHA-1", "x")


def test_add_config_parsing_as_kafka_configs():
    got = scram.parse_add_config("SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=c]")
    assert got == {"SCRAM-SHA-256": {"iterations": "8192", "password": "alice-secret"},
                   "SCRAM-SHA-512": {"password": "c"}}
    with pytest.raises(E.InvalidConfigError, match="takes \\[password"):
        scram.parse_add_config("SCRAM-SHA-256=[iterations=8192]")
    with pytest.raises(E.InvalidConfigError, match="unclosed"):
        scram.parse_add_config("SCRAM-SHA-256=[password=x")


def test_principal_mapping_rules_as_kafka():
    m = PrincipalMapper(r"RULE:^CN=([^,]+),O=(.*)$/$1@$2/L,DEFAULT")
    assert m.name_of("CN=Alice,O=Acme") == "alice@acme"
    assert m.name_of("OU=x") == "OU=x"                      # DEFAULT: the whole DN
    assert PrincipalMapper(r"RULE:^.*CN=([^,]+).*$/$1/,DEFAULT").name_of("CN=broker1,O=r") == "broker1"
    with pytest.raises(E.InvalidConfigError, match="ssl.principal.mapping.rules"):
        PrincipalMapper("RULE:broken")


def test_sasl_token_round_trip_keeps_any_characters():
    token = encode_sasl_token("SCRAM-SHA-256", "al ice", "p:w d")
    assert decode_sasl_token("Bearer " + token) == ("SCRAM-SHA-256", "al ice", "p:w d")
    with pytest.raises(E.SaslAuthenticationFailedError):
        decode_sasl_token("Bearer garbage")


def test_client_security_config_errors_name_the_key():
    assert ClientSecurity.from_config({}).protocol == "PLAINTEXT"
    with pytest.raises(E.InvalidConfigError, match="SASL_PLAINTEXT"):
        ClientSecurity.from_config({"security.protocol": "SASL_PLAINTEXT"})
    with pytest.raises(E.InvalidConfigError, match="needs sasl.username"):
        ClientSecurity.from_config({"security.protocol": "SASL_SSL"})
    with pytest.raises(E.InvalidConfigError, match="ssl.endpoint.identification.algorithm=none"):
        ClientSecurity.from_config({"ssl.endpoint.identification.algorithm": "none"})
    with pytest.raises(E.InvalidConfigError, match="ssl.keystore.location"):
        ClientSecurity.from_config({"ssl.keystore.location": "x"})
    sec = ClientSecurity.from_config({"security.protocol": "sasl_ssl", "sasl.username": "u", "sasl.password": "pw"})
    assert "pw" not in repr(sec) and "pw" not in str(sec.redacted())
