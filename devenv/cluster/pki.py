"""Certificates and keys for the local control plane.

One self-signed CA signs the serving certificates (apiserver; controller-manager and
scheduler share one) and a client certificate per identity (admin, controller-manager,
scheduler, kwok). The client certificate's subject is the identity the apiserver sees: CN
is the user name, O the groups, so the admin is in `system:masters` and the
controller-manager and scheduler get the users that the bootstrap RBAC policy already
grants their rights to. A separate RSA key pair signs and verifies service-account tokens.

Everything is made fresh on each cold `up`: a disposable cluster needs no renewal, and the
certificates cannot go stale between runs.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any test session, short enough that nobody mistakes these for real ones.
VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True)
class ClientIdentity:
    """A user the apiserver authenticates by client certificate."""

    name: str  # file stem under pki/
    user: str  # certificate CN
    groups: tuple[str, ...] = ()  # certificate O entries


CLIENTS: tuple[ClientIdentity, ...] = (
    ClientIdentity("admin", "vllm-operator-e2e-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    # kwok writes the status of nodes and pods of every namespace and deletes pods; its
    # rights are cluster-wide anyway, so it gets no narrower role than the admin's.
    ClientIdentity("kwok", "kwok-controller", ("system:masters",)),
    # The real node (node.py): the Node authorizer and NodeRestriction know a kubelet by
    # this user and group; kube-proxy's user is bound to system:node-proxier by bootstrap RBAC.
    ClientIdentity("kubelet", "system:node:real-node", ("system:nodes",)),
    ClientIdentity("kube-proxy", "system:kube-proxy"),
)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 is accepted by every component and takes microseconds to generate.
    return ec.generate_private_key(ec.SECP256R1())


def _sign(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    is_ca: bool = False,
    usages: tuple[x509.ObjectIdentifier, ...] = (),
    sans: tuple[x509.GeneralName, ...] = (),
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject if ca_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Backdated a little so a clock that is a few seconds off does not reject it.
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        ).add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if ca_cert is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), False)
    return builder.sign(ca_key, hashes.SHA256())


def serving_pair(directory: Path, *, ca_cn: str, cn: str, ip: str = "127.0.0.1") -> bytes:
    """A fresh CA and a serving certificate for ``ip`` signed by it, written as
    ``directory/tls.crt`` and ``tls.key`` (the names controller-runtime's webhook server
    reads); returns the CA's PEM, for a webhook configuration's caBundle."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_cert = _sign(_name(ca_cn), ca_key, None, ca_key, is_ca=True)
    key = _new_key()
    cert = _sign(
        _name(cn),
        key,
        ca_cert,
        ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        sans=(x509.IPAddress(ipaddress.ip_address(ip)),),
    )
    _write_key(directory / "tls.key", key)
    _write_cert(directory / "tls.crt", cert)
    return ca_cert.public_bytes(serialization.Encoding.PEM)


def generate(pki: Path, *, service_ip: str) -> None:
    """Writes the CA, serving, client and service-account material into `pki`.

    `service_ip` is the first address of the service range: in-cluster clients reach the
    apiserver as `kubernetes.default.svc`, whose ClusterIP that is, so it must be a SAN.
    """
    pki.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_cert = _sign(_name("vllm-operator-e2e-ca"), ca_key, None, ca_key, is_ca=True)
    _write_key(pki / "ca.key", ca_key)
    _write_cert(pki / "ca.crt", ca_cert)

    dns = (
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    sans: tuple[x509.GeneralName, ...] = (
        *(x509.DNSName(d) for d in dns),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(service_ip)),
        # The real node's address, where pods reach the apiserver (node.py).
        x509.IPAddress(ipaddress.ip_address("198.18.0.1")),
    )
    key = _new_key()
    cert = _sign(
        _name("kube-apiserver"),
        key,
        ca_cert,
        ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        sans=sans,
    )
    _write_key(pki / "apiserver.key", key)
    _write_cert(pki / "apiserver.crt", cert)

    # Controller-manager and scheduler serve /healthz over TLS; a certificate from our CA
    # (rather than their self-signed default) lets the health checks verify them.
    key = _new_key()
    cert = _sign(
        _name("vllm-operator-e2e-components"),
        key,
        ca_cert,
        ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        sans=(x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))),
    )
    _write_key(pki / "serving.key", key)
    _write_cert(pki / "serving.crt", cert)

    for client in CLIENTS:
        key = _new_key()
        cert = _sign(
            _name(client.user, client.groups),
            key,
            ca_cert,
            ca_key,
            usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
        )
        _write_key(pki / f"{client.name}.key", key)
        _write_cert(pki / f"{client.name}.crt", cert)

    # The aggregation layer's own CA and the client the apiserver proxies as.
    fp_key = _new_key()
    fp_cert = _sign(_name("vllm-operator-e2e-front-proxy-ca"), fp_key, None, fp_key, is_ca=True)
    _write_key(pki / "front-proxy-ca.key", fp_key)
    _write_cert(pki / "front-proxy-ca.crt", fp_cert)
    key = _new_key()
    cert = _sign(
        _name("front-proxy-client"),
        key,
        fp_cert,
        fp_key,
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )
    _write_key(pki / "front-proxy-client.key", key)
    _write_cert(pki / "front-proxy-client.crt", cert)

    # Service-account tokens: RSA, because every token consumer (including older client
    # libraries that verify them) accepts RS256.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
