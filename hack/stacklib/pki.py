"""Throwaway certificates for the verbs' mutual TLS (openssl)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def tls_pki(folder: Path, name: str = "rlsched-test", key_type: str = "ec") -> dict[str, Path]:
    """A throwaway CA in ``folder`` (openssl) and, signed by it, a server certificate for 127.0.0.1 /
    localhost and a client certificate: the files of the verbs' mutual TLS (``server.tls``, kube-scheduler's
    ``tlsConfig``). Keys: ``ca``, ``server_cert``, ``server_key``, ``client_cert``, ``client_key``.
    ``key_type``: ``ec`` (P-256) or ``rsa`` (2048 bits), for every key."""
    folder.mkdir(parents=True, exist_ok=True)
    key = {
        "ec": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"],
        "rsa": ["-newkey", "rsa:2048", "-nodes"],
    }[key_type]
    out = {"ca": folder / "ca.crt", "ca_key": folder / "ca.key"}

    def openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-1000:]}")

    openssl(
        "req",
        "-x509",
        *key,
        "-keyout",
        str(out["ca_key"]),
        "-out",
        str(out["ca"]),
        "-days",
        "2",
        "-subj",
        f"/CN={name}-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    for role, cn, ext in (
        ("server", "rlsched-extender", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "kube-scheduler", "extendedKeyUsage=clientAuth"),
    ):
        k, csr, crt, extfile = (folder / f"{role}.{x}" for x in ("key", "csr", "crt", "ext"))
        extfile.write_text(
            ext + "\nkeyUsage=critical,digitalSignature\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        openssl("req", *key, "-keyout", str(k), "-out", str(csr), "-subj", f"/CN={cn}")
        openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(out["ca"]),
            "-CAkey",
            str(out["ca_key"]),
            "-CAcreateserial",
            "-out",
            str(crt),
            "-days",
            "2",
            "-extfile",
            str(extfile),
        )
        out[f"{role}_cert"], out[f"{role}_key"] = crt, k
    return out
