"""How TensorFlow's own ``gs://`` reaches the local Cloud Storage: an HTTPS proxy on loopback.

TensorFlow's file system talks to ``www.googleapis.com`` and ``storage.googleapis.com`` with no
endpoint setting (tsl/platform/cloud/gcs_file_system.cc), but through libcurl, which honours
``https_proxy``, trusts the CA file named by ``CURL_CA_BUNDLE`` (curl_http_request.cc) and
signs in with ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` when set (google_auth_provider.cc). So the
emulator's replicas get this proxy as ``https_proxy``: a CONNECT to one of `INTERCEPTED` is
answered here, under a certificate of a certificate authority made for this job only (in the
job's folder, trusted through that bundle and nowhere else), by the same request handler as the
plain-HTTP endpoint; any other host is tunnelled through untouched, so downloads of the user's
code work as before. Where no certificate can be made (no `cryptography`, no ``openssl``), a
CONNECT to Google's storage hosts is refused: a client is stopped rather than reaching a real
bucket of the same name.
"""

from __future__ import annotations

import datetime
import os
import select
import shutil
import socket
import socketserver
import ssl
import subprocess
from pathlib import Path

from labkit.vertex.storage.api import StorageHandler

INTERCEPTED = ("storage.googleapis.com", "www.googleapis.com")
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                   "/etc/ssl/cert.pem", "/etc/ssl/ca-bundle.pem")


def intercepted(host: str) -> bool:
    return host in INTERCEPTED or host.endswith(".storage.googleapis.com")


def system_bundle() -> str | None:
    """The CA bundle this machine's clients trust (certifi's, else the system's)."""
    try:
        import certifi

        return certifi.where()
    except ImportError:
        pass
    return next((p for p in _SYSTEM_BUNDLES if os.path.isfile(p)), None)


def make_authority(folder: Path) -> tuple[Path, Path, Path] | None:
    """A CA and a certificate for Google's storage hosts signed by it, in `folder`:
    (server cert, server key, CA bundle = this machine's CAs + this CA), or None."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key, ca = folder / "server.pem", folder / "server.key", folder / "ca.pem"
    try:
        _with_cryptography(cert, key, ca)
    except ImportError:
        if not _with_openssl(folder, cert, key, ca):
            return None
    bundle = folder / "ca-bundle.pem"
    system = system_bundle()
    bundle.write_bytes((Path(system).read_bytes() + b"\n" if system else b"") + ca.read_bytes())
    return cert, key, bundle


def _with_cryptography(cert_path: Path, key_path: Path, ca_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "labkit emulated Cloud Storage CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    names = [x509.DNSName(h) for h in (*INTERCEPTED, "*.storage.googleapis.com")]
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, INTERCEPTED[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_path.write_bytes(ca.public_bytes(pem))
    cert_path.write_bytes(leaf.public_bytes(pem))
    key_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)


def _with_openssl(folder: Path, cert: Path, key: Path, ca: Path) -> bool:
    openssl = shutil.which("openssl")
    if not openssl:
        return False
    ca_key, ext = folder / "ca.key", folder / "server.ext"
    ext.write_text("basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n"
                   "subjectAltName=" + ",".join(f"DNS:{h}" for h in (*INTERCEPTED, "*.storage.googleapis.com")) + "\n")
    steps = [
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(ca_key), "-out", str(ca), "-days", "30", "-subj", "/CN=labkit emulated Cloud Storage CA",
         "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"],
        [openssl, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(key), "-out", str(folder / "server.csr"), "-subj", f"/CN={INTERCEPTED[0]}"],
        [openssl, "x509", "-req", "-in", str(folder / "server.csr"), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(cert), "-days", "30", "-extfile", str(ext)],
    ]
    for argv in steps:
        if subprocess.run(argv, capture_output=True).returncode != 0:
            return False
    return True


class ProxyHandler(socketserver.StreamRequestHandler):
    """One CONNECT: answered by the local Cloud Storage for Google's storage hosts (when the
    server has a certificate), tunnelled for every other host."""

    def handle(self) -> None:
        line = self.rfile.readline(65537).decode("latin-1").strip()
        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
            pass
        method, _, rest = line.partition(" ")
        target = rest.split(" ")[0]
        if method != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        if intercepted(host):
            if self.server.context is None:  # type: ignore[attr-defined]
                self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            try:
                tls = self.server.context.wrap_socket(self.connection, server_side=True)  # type: ignore[attr-defined]
            except (ssl.SSLError, OSError):
                return
            StorageHandler(tls, self.client_address, self.server.api)  # type: ignore[attr-defined]
            return
        self.tunnel(host, int(port or 443))

    def tunnel(self, host: str, port: int) -> None:
        try:
            upstream = socket.create_connection((host, port), timeout=30)
        except OSError as e:
            self.wfile.write(f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nX-Reason: {e}\r\n\r\n".encode())
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        sockets = [self.connection, upstream]
        with upstream:
            while True:
                ready, _, _ = select.select(sockets, [], [], 300)
                if not ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (upstream if s is self.connection else self.connection).sendall(data)


class ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, api_server, certificate: tuple[Path, Path] | None):
        super().__init__(address, ProxyHandler)
        self.api = api_server
        self.context = None
        if certificate is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(str(certificate[0]), str(certificate[1]))
