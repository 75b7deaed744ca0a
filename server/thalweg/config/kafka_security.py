"""How a Kafka source's clients prove who they are: TLS, client certificates, SASL.

One table for the consumer, the ``do_put`` producer and the dead-letter topic producer
(they talk to one cluster; ``thalweg.kafka.clients`` builds their arguments from it).
Kept apart from ``config.models`` because it is the part of a source an operator copies
from their cluster's connection page, and the part ``docs/security.md`` explains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class SaslOAuthConfig(BaseModel):
    """Where an ``OAUTHBEARER`` login gets its token: exactly one of a token file, an
    OIDC client-credentials endpoint, or AWS MSK IAM.

    A token file is read again for every login (a sidecar or a Kubernetes projected
    volume may rotate it); an endpoint's or MSK's token is kept until shortly before it
    expires.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    token_file: Path | None = Field(
        None, description="A file holding the bearer token (re-read at every login)."
    )
    token_url: str | None = Field(
        None, description="OIDC token endpoint: client-credentials grant (RFC 6749 4.4)."
    )
    client_id: str | None = None
    client_secret: SecretStr | None = None
    scope: str | None = Field(None, description="The scope asked for, if the IdP needs one.")
    extensions: dict[str, str] = Field(
        default_factory=dict,
        description="SASL extensions sent with the token (Confluent Cloud: "
        "logicalCluster and identityPoolId).",
    )
    aws_region: str | None = Field(
        None,
        description="AWS MSK IAM: the cluster's region; credentials come from the usual "
        "AWS chain (environment, profile, IRSA). Needs the 'msk' extra.",
    )
    token_timeout_s: float = Field(10.0, gt=0, description="How long fetching one token may take.")

    @model_validator(mode="after")
    def _one_provider(self) -> SaslOAuthConfig:
        named = [
            n for n in ("token_file", "token_url", "aws_region") if getattr(self, n) is not None
        ]
        if len(named) != 1:
            raise ValueError(
                "sasl_oauth: set exactly one of token_file, token_url (with client_id and "
                "client_secret) and aws_region (MSK IAM)"
            )
        if self.token_url is not None:
            if not self.token_url.startswith(("http://", "https://")):
                raise ValueError("sasl_oauth.token_url must start with http:// or https://")
            if not (self.client_id and self.client_secret):
                raise ValueError("sasl_oauth.token_url needs client_id and client_secret")
        return self

    @property
    def provider(self) -> Literal["file", "oidc", "msk_iam"]:
        if self.token_file is not None:
            return "file"
        return "oidc" if self.token_url is not None else "msk_iam"


class KafkaSecurity(BaseModel):
    """The security fields of a Kafka source (a mix-in of ``KafkaSourceConfig``)."""

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_oauth: SaslOAuthConfig | None = Field(
        None, description="The token provider of sasl_mechanism = 'OAUTHBEARER'."
    )
    ssl_cafile: Path | None = Field(
        None, description="CA bundle that signed the brokers' certificates (default: system)."
    )
    ssl_certfile: Path | None = Field(
        None, description="Client certificate (PEM), for brokers that require mutual TLS."
    )
    ssl_keyfile: Path | None = Field(None, description="The client certificate's key (PEM).")
    ssl_key_password: SecretStr | None = Field(
        None, description="Password of an encrypted ssl_keyfile."
    )
    login_retry_max_s: float = Field(
        300.0,
        ge=1,
        description="The longest wait between two logins a broker refused (a wrong "
        "credential, a TLS failure): retries back off from a few seconds to this, so a "
        "bad secret never becomes a login storm that locks the account.",
    )

    def check_security(self) -> None:
        """Cross-field rules (called from the source's validator)."""
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        sasl = self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism")
        if self.sasl_mechanism is not None and not sasl:
            raise ValueError("sasl_mechanism needs security_protocol SASL_SSL (or SASL_PLAINTEXT)")
        if self.sasl_mechanism == "OAUTHBEARER":
            if self.sasl_oauth is None:
                raise ValueError("sasl_mechanism OAUTHBEARER needs a [sources.sasl_oauth] table")
        elif self.sasl_oauth is not None:
            raise ValueError("sasl_oauth is only used with sasl_mechanism = 'OAUTHBEARER'")
        elif self.sasl_mechanism and not (self.sasl_username and self.sasl_password):
            raise ValueError("sasl_mechanism needs sasl_username and sasl_password")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together")
        if self.ssl_key_password is not None and self.ssl_keyfile is None:
            raise ValueError("ssl_key_password needs ssl_keyfile")
        if not tls and any((self.ssl_cafile, self.ssl_certfile)):
            raise ValueError("ssl_cafile and ssl_certfile need security_protocol SSL or SASL_SSL")

    def security_secrets(self) -> list[str]:
        """Names of the secrets set here (relative to the source)."""
        out = [n for n in ("sasl_password", "ssl_key_password") if getattr(self, n) is not None]
        if self.sasl_oauth is not None and self.sasl_oauth.client_secret is not None:
            out.append("sasl_oauth.client_secret")
        return out
