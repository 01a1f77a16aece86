"""The test cluster's PKI, static tokens and kubeconfigs, all files under its work directory.

One self-made CA signs the apiserver's serving certificate, with 127.0.0.1, localhost and
the in-cluster names as SANs, so clients verify TLS against ``ca.crt`` instead of skipping
it. A second CA signs the front-proxy client certificate; the ServiceAccount signing key is
a separate RSA key. Certificates live two days, enough for any test session. The
``cryptography`` package is imported only when a cluster starts, so the package stays
importable without it.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotwright.testing._control_plane import ADVERTISE_ADDRESS, FRONT_PROXY_CLIENT
from spotwright.testing._errors import ClusterUnavailable


def write_private(path: Path, data: bytes | str) -> None:
    """Write a key, token file or kubeconfig readable by its owner only."""
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(0o600)


@dataclass
class Credentials:
    """The PKI and tokens of one cluster, all files in ``pki/`` of its work directory."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    tokens: dict[str, str] = field(default_factory=dict)  # user name -> bearer token


def generate_credentials(pki: Path, users: Mapping[str, tuple[str, ...]]) -> Credentials:
    """The cluster CA and apiserver serving certificate, a front-proxy CA and client
    certificate (the request-header authentication kube-controller-manager and
    kube-scheduler look up, and the aggregator uses), a ServiceAccount key pair, and
    static tokens."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # pragma: no cover - cryptography is a test dependency
        raise ClusterUnavailable("the `cryptography` package is not installed") from exc
    import ipaddress

    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=2)

    def pem_key(key: Any) -> bytes:
        return bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def pem_cert(cert: Any) -> bytes:
        return bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        common_name: str,
        issuer: tuple[Any, Any] | None = None,
        *,
        usage: Any = None,
        sans: list[x509.GeneralName] | None = None,
    ) -> tuple[Any, Any]:
        """A (certificate, key) pair: a self-signed CA without ``issuer``, else a leaf."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        signer_cert, signer_key = issuer if issuer else (None, key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(signer_cert.subject if signer_cert is not None else name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), True)
        )
        if issuer is None:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        else:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()),
                False,
            ).add_extension(x509.ExtendedKeyUsage([usage]), False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
        return builder.sign(signer_key, hashes.SHA256()), key

    ca = issue("spotwright-testcluster-ca")
    serving = issue(
        "kube-apiserver",
        ca,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.96.0.1")),  # the `kubernetes` Service
            x509.IPAddress(ipaddress.ip_address(ADVERTISE_ADDRESS)),
            *(
                x509.DNSName(name)
                for name in (
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                )
            ),
        ],
    )
    front_proxy_ca = issue("spotwright-testcluster-front-proxy-ca")
    front_proxy_client = issue(
        FRONT_PROXY_CLIENT, front_proxy_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    creds = Credentials(
        ca_cert=pki / "ca.crt",
        ca_key=pki / "ca.key",
        serving_cert=pki / "apiserver.crt",
        serving_key=pki / "apiserver.key",
        front_proxy_ca_cert=pki / "front-proxy-ca.crt",
        front_proxy_client_cert=pki / "front-proxy-client.crt",
        front_proxy_client_key=pki / "front-proxy-client.key",
        sa_key=pki / "sa.key",
        sa_pub=pki / "sa.pub",
        token_file=pki / "tokens.csv",
    )
    creds.ca_cert.write_bytes(pem_cert(ca[0]))
    write_private(creds.ca_key, pem_key(ca[1]))
    creds.serving_cert.write_bytes(pem_cert(serving[0]))
    write_private(creds.serving_key, pem_key(serving[1]))
    creds.front_proxy_ca_cert.write_bytes(pem_cert(front_proxy_ca[0]))
    creds.front_proxy_client_cert.write_bytes(pem_cert(front_proxy_client[0]))
    write_private(creds.front_proxy_client_key, pem_key(front_proxy_client[1]))
    write_private(creds.sa_key, pem_key(sa_key))
    creds.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    rows = []
    for index, (user, groups) in enumerate(users.items()):
        token = secrets.token_urlsafe(32)
        creds.tokens[user] = token
        group_field = '"' + ",".join(groups) + '"' if groups else ""
        rows.append(f"{token},{user},uid-{index},{group_field}".rstrip(","))
    write_private(creds.token_file, "\n".join(rows) + "\n")
    return creds


def write_kubeconfig(
    path: Path, *, server: str, ca_file: Path, token: str, user: str, namespace: str = "default"
) -> Path:
    """Write a token kubeconfig (JSON is valid YAML, so no YAML writer is needed)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "spotwright-test",
                "cluster": {
                    "server": server,
                    "certificate-authority": str(ca_file),
                },
            },
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": "spotwright-test",
                "context": {
                    "cluster": "spotwright-test",
                    "user": user,
                    "namespace": namespace,
                },
            },
        ],
        "current-context": "spotwright-test",
    }
    write_private(path, json.dumps(config, indent=2) + "\n")
    return path
