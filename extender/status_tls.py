"""HTTPS on the status listener, with its certificate re-read when the files change.

The status listener's callers send bearer tokens (:mod:`rlsched.extender.auth`); over plain HTTP those
tokens cross the pod network in the clear. With ``server.statusTls`` the listener serves TLS 1.2 or
newer with that certificate, and asks no client certificate: callers authenticate with their tokens,
as before.

Certificates are rotated under a running process: the kubelet swaps a Secret volume's symlink,
cert-manager renews before expiry. :class:`StatusTls` compares ``os.stat`` of the two files (their
resolved paths) every :data:`RELOAD_CHECK_S` seconds and, when either changed, loads the pair into a
new :class:`ssl.SSLContext`. The context the listener was started with is never loaded into again:
its ``sni_callback`` (which OpenSSL calls in every handshake, with or without a server name) hands
each new connection the newest context that loaded, so new handshakes get the new certificate and
open connections keep theirs. Loading into the live context instead would go wrong twice over:
``load_cert_chain`` keeps one certificate per key type, so a rotation from RSA to ECDSA (or back)
would leave the old certificate served to clients that prefer its type; and it installs the
certificate before it reads the key, so a pair that fails halfway leaves a context without a key,
failing every handshake.

A pair that does not load (a rotation half written, a key that does not match, an encrypted key)
leaves the previous one serving. Failures are counted
(``rlsched_extender_status_tls_reloads_total{result="error"}``), logged once per distinct failure,
and tried again when the files change again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from .settings import ConfigError, StatusTlsSettings

log = logging.getLogger("rlsched.extender.tls")

RELOAD_CHECK_S = 5.0
"""Seconds between checks of the certificate files for a change (two ``stat`` calls each)."""

MAX_PEM_BYTES = 1024 * 1024
"""A certificate chain or key file larger than this is not read (they are a few KiB)."""

_Stamp = tuple[Any, ...]


def _stamp(path: str) -> _Stamp:
    """What changes when ``path``'s content is replaced: the resolved path (the kubelet swaps a
    symlink), device, inode, size and times; the error's name when it cannot be read."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        return (real, type(exc).__name__, exc.errno)
    return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _readable(key: str, path: str) -> None:
    """ConfigError naming ``server.statusTls.<key>`` and the file when it cannot be read."""
    try:
        with open(path, "rb") as f:
            if len(f.read(MAX_PEM_BYTES + 1)) > MAX_PEM_BYTES:
                raise ConfigError(f"server.statusTls.{key} {path}: larger than {MAX_PEM_BYTES // 1024} KiB; not read")
    except OSError as exc:
        raise ConfigError(f"server.statusTls.{key} {path}: cannot read: {exc.strerror or exc}") from None


def new_context() -> ssl.SSLContext:
    """A server-side context: TLS 1.2 or newer, no client certificate asked."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def no_passphrase(setting: str, key_file: str) -> Callable[[], str]:
    """``load_cert_chain``'s ``password=`` for ``setting`` (e.g. ``server.statusTls.keyFile``): called by
    OpenSSL only for an encrypted key, it refuses it. Without it OpenSSL would ask for the passphrase
    on the terminal (blocking the process; without one, the load fails with a bare "Invalid
    argument")."""

    def refuse() -> str:
        raise ConfigError(
            f"{setting} {key_file}: encrypted private keys are not supported: store the key unencrypted "
            "(as a kubernetes.io/tls Secret and cert-manager hold it; the Secret protects it)"
        )

    return refuse


def load_context(tls: StatusTlsSettings) -> ssl.SSLContext:
    """A new server context (:func:`new_context`) serving ``certFile``/``keyFile``; ConfigError names
    the file at fault."""
    cert, key = tls.cert_file or "", tls.key_file or ""
    _readable("certFile", cert)
    _readable("keyFile", key)
    try:
        new_context().load_verify_locations(cafile=cert)  # parses the certificates alone
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"server.statusTls.certFile {cert}: not a PEM certificate: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    ctx = new_context()
    try:
        ctx.load_cert_chain(cert, key, password=no_passphrase("server.statusTls.keyFile", key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"server.statusTls.keyFile {key}: not a PEM private key of certFile {cert}: "
            f"{getattr(exc, 'strerror', None) or exc}"
        ) from None
    return ctx


def not_after(cert_file: str) -> float | None:
    """The certificate's notAfter (epoch seconds), or None when it cannot be read.

    The standard library decodes a certificate file only through ``ssl._ssl._test_decode_cert``, a
    private helper; it is used when present and nothing depends on it (``/status`` shows None)."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        return float(ssl.cert_time_to_seconds(decode(cert_file)["notAfter"]))
    except Exception:  # noqa: BLE001 - a private helper: any failure only hides the date
        return None


class StatusTls:
    """The status listener's SSLContext and the reloads of its certificate.

    ``context`` is the listener's (never loaded into after start-up), ``current`` the context of the
    pair that serves new connections. ``count(result)`` counts each reload attempt (``ok`` or
    ``error``); ``clock`` gives wall-clock seconds for ``/status``. The constructor loads the pair
    (ConfigError names the file at fault)."""

    def __init__(
        self,
        settings: StatusTlsSettings,
        count: Callable[[str], None] = lambda result: None,
        clock: Callable[[], float] = time.time,
    ):
        self.settings, self.count, self.clock = settings, count, clock
        # stamped before the load: a change while it reads is seen at the next check
        self._seen: tuple[_Stamp, _Stamp] | None = self._stamps()
        self.current = load_context(settings)
        self.context = self.current
        self.context.sni_callback = self._select
        self.loaded_at = clock()
        self.not_after = not_after(settings.cert_file or "")
        self.error: str | None = None
        """The last reload's failure (cleared by a reload that works)."""
        self.error_at: float | None = None

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None, listener: ssl.SSLContext) -> None:
        """The listener context's ``sni_callback``: this handshake uses the newest pair that loaded."""
        ssl_object.context = self.current

    def _stamps(self) -> tuple[_Stamp, _Stamp]:
        return _stamp(self.settings.cert_file or ""), _stamp(self.settings.key_file or "")

    def check(self) -> bool:
        """Load the pair again when either file changed since the last look; True when a new pair
        now serves. A failure keeps the previous pair, and is tried again once the files change."""
        stamps = self._stamps()
        if stamps == self._seen:
            return False
        self._seen = stamps
        try:
            self.current = load_context(self.settings)  # a new context: the one serving is never touched
        except ConfigError as exc:
            self._failed(str(exc))
            return False
        self.loaded_at, self.not_after = self.clock(), not_after(self.settings.cert_file or "")
        self.error = self.error_at = None
        self.count("ok")
        log.info(
            "status listener: loaded the new certificate %s", self.settings.cert_file, extra={"event": "tls_reload"}
        )
        return True

    def _failed(self, message: str) -> None:
        self.count("error")
        if message != self.error:  # once per distinct failure, not once per try
            log.warning(
                "status listener: the changed certificate files do not load, the previous certificate keeps "
                "serving (tried again when they change): %s",
                message,
                extra={"event": "tls_reload_failed"},
            )
        self.error, self.error_at = message, self.clock()

    async def run(self, interval_s: float | None = None) -> None:
        """Check every ``interval_s`` seconds (default :data:`RELOAD_CHECK_S`), until cancelled."""
        while True:
            await asyncio.sleep(RELOAD_CHECK_S if interval_s is None else interval_s)
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - the check must outlive any surprise; the old pair serves
                self._failed(f"{type(exc).__name__}: {exc}")

    async def cleanup_ctx(self, app: Any) -> AsyncIterator[None]:
        """The status app's ``cleanup_ctx``: the reload checks run while the listener does."""
        task = asyncio.create_task(self.run(), name="status-tls-reload")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        """``/status`` → ``statusTls``."""
        return {
            "enabled": True,
            "certFile": self.settings.cert_file,
            "loadedAt": self.loaded_at,
            "notAfter": self.not_after,
            "reloadError": self.error,
            "reloadErrorAt": self.error_at,
        }
