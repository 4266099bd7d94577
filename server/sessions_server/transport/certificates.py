"""The server's TLS certificate, key and client CA, read again when their files change.

gRPC asks for the certificate configuration at each new connection's handshake (the fetcher of
`dynamic_ssl_server_credentials`, called on one of gRPC's own threads). The fetcher only looks at
the files' metadata: when they changed, a thread of its own reads and checks them, and the
handshake that noticed waits for it up to `FETCH_WAIT_SECONDS` (else a later handshake hands the
result over). A renewed certificate (cert-manager rewriting a mounted Secret, a cron job's
renewal) is so served to new connections without a restart, the first one after the change
included (it got the old certificate, expired when the renewal came late), while connections
already open keep the one they began with; and no handshake waits longer than that, nor the
server's shutdown at all, for the files to be read (a slow or hung file system). gRPC checks a
configuration only as a handshake uses it, so a pair that does not load here (a key not matching
its certificate, a file half written or not readable yet) is not handed over: the previous pair
stays in use, a warning says why, and the files are tried again once they change, or after
`RETRY_SECONDS`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import ssl
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("sessions.transport")

RETRY_SECONDS = 30.0  # a refused pair is read again after this long, changed or not
# A certificate whose validity begins within this long is taken (the issuer's clock and this
# machine's may differ a little); one expired, or beginning later, is refused: every client
# would refuse it.
CLOCK_SKEW_SECONDS = 300.0
EXPIRY_WARNING_SECONDS = 14 * 86_400  # a certificate closer than this to its end is warned of
EXPIRED_LOG_SECONDS = 3600.0  # how often a served certificate past its end is logged again
# How long the handshake that noticed the files change waits for them to be read and checked
# (tens of milliseconds, unless the file system stalls). gRPC holds its credentials' lock while
# it asks: the port's other new TLS connections wait as long, once for each change.
FETCH_WAIT_SECONDS = 2.0

_Signature = tuple[tuple[int, ...], ...]


class CertificateFiles:
    """The PEM files of `--tls-cert`, `--tls-key` and `--tls-client-ca` (mTLS when given)."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self._paths = [("--tls-cert", cert), ("--tls-key", key)]
        if client_ca is not None:
            self._paths.append(("--tls-client-ca", client_ca))
        self._lock = threading.Lock()  # held for a few assignments, never while files are read
        self._served: _Signature = ()  # the files as read for the configuration in use (or ready)
        self._refused: _Signature = ()
        self._retry_at = 0.0
        self._loading = False
        self._ready: grpc.ServerCertificateConfiguration | None = None
        self._served_until: float | None = None  # the served certificate's end, when it could be read
        self._expired_logged_at = -math.inf

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials serving the files as they are now, then as they change. Raises
        OSError naming the flag at fault when a file cannot be read or the pair does not load."""
        signature = self._signature()
        configuration = self._load()
        self._served, self._served_until = signature, _end_of(self._paths[0][1])
        # The fetcher returns None for "no change", as gRPC's documentation says; its type stubs
        # leave None out.
        fetch: Any = self._fetch
        return grpc.dynamic_ssl_server_credentials(
            configuration, fetch, require_client_authentication=len(self._paths) == 3
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a configuration read since the last handshake, else None (the current
        one stays), starting a read when the files changed. Never raises: an exception here
        would fail the handshake."""
        try:
            self._note_expired()
            with self._lock:
                ready, self._ready = self._ready, None
                if ready is not None or self._loading:
                    return ready
                signature = self._signature()
                if signature == self._served or (signature == self._refused and time.monotonic() < self._retry_at):
                    return None
                self._loading = True
            read = threading.Event()
            try:
                threading.Thread(
                    target=self._read_changed, args=(signature, read), name="tls-reload", daemon=True
                ).start()
            except BaseException:
                with self._lock:
                    self._loading = False  # else no change would ever be read again
                raise
            if read.wait(FETCH_WAIT_SECONDS):
                with self._lock:
                    ready, self._ready = self._ready, None
                return ready
        except Exception:
            log.exception("could not check the TLS files; the previous ones stay in use")
        return None

    def _read_changed(self, signature: _Signature, read: threading.Event) -> None:
        configuration = None
        try:
            configuration = self._load()
            if self._signature() != signature:
                configuration = None  # changed again while being read: the next handshake looks again
        except Exception as exc:
            log.warning("TLS files changed but were not taken (the previous ones stay in use): %s", exc)
            with self._lock:
                self._refused, self._retry_at = signature, time.monotonic() + RETRY_SECONDS
        finally:
            ends = _end_of(self._paths[0][1]) if configuration is not None else None
            with self._lock:
                self._loading = False
                previous = self._served
                if configuration is not None:
                    self._ready, self._served, self._served_until = configuration, signature, ends
            read.set()
        if configuration is not None:
            changed = [
                f"{flag} {path}"
                for (flag, path), was, now in zip(self._paths, previous, signature, strict=True)
                if was != now
            ]
            log.info(
                "TLS files read again (%s)%s; new connections get them",
                ", ".join(changed) or "unchanged",
                _validity(self._paths[0][1]),
            )

    def _note_expired(self) -> None:
        """Logs, once an hour while handshakes come, a served certificate past its end: every
        client refuses it, and the server said so only when it was read."""
        now = time.monotonic()
        if self._served_until is None or wall_clock() <= self._served_until:
            return
        if now - self._expired_logged_at < EXPIRED_LOG_SECONDS:
            return
        self._expired_logged_at = now
        log.error(
            "the TLS certificate served (--tls-cert %s) expired on %s: clients refuse every new connection; "
            "renew it (new connections take a renewed one without a restart) (%s)",
            self._paths[0][1],
            _utc(self._served_until),
            _clock_reads(wall_clock()),
        )

    def _signature(self) -> _Signature:
        """What identifies the files' current contents and access without reading them (a
        replaced file, or a symlink pointed elsewhere as a Secret volume's update does, has
        another inode; a chmod or chown changes the ctime)."""
        stats: list[tuple[int, ...]] = []
        for _, path in self._paths:
            try:
                found = os.stat(path)
            except OSError:
                stats.append((0,))
            else:
                stats.append((found.st_dev, found.st_ino, found.st_mtime_ns, found.st_ctime_ns, found.st_size))
        return tuple(stats)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        contents = {flag: _read(flag, path) for flag, path in self._paths}
        pair = _check_pair(self._paths[0][1], self._paths[1][1])
        _check_dates(self._paths[0][1])
        _check_server_purpose(self._paths[0][1], pair)
        _check_usable_by_grpc(contents["--tls-key"], contents["--tls-cert"])
        if len(self._paths) == 3:
            _check_authorities(self._paths[2][1])
        return grpc.ssl_server_certificate_configuration(
            [(contents["--tls-key"], contents["--tls-cert"])], root_certificates=contents.get("--tls-client-ca")
        )


def _read(flag: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"could not read {flag} {path}: {exc.strerror}") from None


def _check_pair(cert: Path, key: Path) -> ssl.SSLContext:
    """A server's TLS context holding the pair, refused when they are no pair."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # A password callback that gives none: an encrypted key fails here, as gRPC cannot use it.
        server.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise OSError(
            f"--tls-cert {cert} and --tls-key {key} are no certificate chain and matching private key in PEM ({exc})"
        ) from None
    return server


# OpenSSL's X509_V_ERR_INVALID_PURPOSE: a certificate whose key usages leave out what it is used for.
_INVALID_PURPOSE = 26


def _check_server_purpose(cert: Path, server: ssl.SSLContext) -> None:
    """Refuses a certificate that is not for TLS servers (a client's, whose extended key usage
    is clientAuth alone), which every client refuses ("unsupported certificate purpose") while
    the server started without a word. Told by a handshake in memory with a client that trusts
    the certificate itself, so that its key usages are all that is judged. `server` holds the
    pair (`_check_pair`)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.load_verify_locations(cafile=cert)
    client.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = (client.wrap_bio(to_client, to_server), server.wrap_bio(to_server, to_client, server_side=True))
    try:
        for _ in range(8):  # a TLS 1.3 handshake takes two flights each way
            for end in ends:
                with contextlib.suppress(ssl.SSLWantReadError):
                    end.do_handshake()
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code == _INVALID_PURPOSE:
            raise OSError(
                f"--tls-cert {cert} is no TLS server's certificate (its key usages leave out serverAuth): clients "
                'would refuse it ("unsupported certificate purpose"); give a server certificate'
            ) from None
    except ssl.SSLError:
        return  # another matter (its dates, say), which the other checks judge


def _check_usable_by_grpc(key: bytes, cert: bytes) -> None:
    """gRPC's TLS library takes fewer keys than Python's `ssl` (no Ed448 nor RSA-PSS keys, say):
    such a pair passed the checks above, was announced as served, and gRPC kept the previous
    one, saying so only in its own log lines. A throwaway server on a loopback port of its own
    tells: one that cannot listen with the pair but can without it refuses the pair."""
    if not _listens(grpc.ssl_server_credentials([(key, cert)])) and _listens(None):
        raise OSError(
            "gRPC cannot use --tls-cert and --tls-key (its TLS library takes RSA keys and ECDSA keys "
            "of the P-256, P-384 and P-521 curves, among others; not Ed448 nor RSA-PSS keys)"
        )


def _listens(credentials: grpc.ServerCredentials | None) -> bool:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        if credentials is None:
            return server.add_insecure_port("127.0.0.1:0") != 0
        return server.add_secure_port("127.0.0.1:0", credentials) != 0
    except RuntimeError:
        return False
    finally:
        server.stop(None)


def _dates(cert: Path) -> tuple[str, str] | None:
    """The certificate's notBefore and notAfter as written in it; None when they cannot be
    read. Python's `ssl` reads them through the decoder its own tests use (without it, None)."""
    decode = getattr(ssl._ssl, "_test_decode_cert", None)  # type: ignore[attr-defined]
    try:
        fields = decode(str(cert)) if decode is not None else None
        return None if fields is None else (str(fields["notBefore"]), str(fields["notAfter"]))
    except (ssl.SSLError, OSError, ValueError, KeyError):
        return None


def wall_clock() -> float:
    """Now, as certificates' dates count (tests move it)."""
    return time.time()


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _clock_reads(now: float) -> str:
    """What a certificate's dates were judged by: a server whose clock is off refuses a valid
    certificate, or serves one its clients refuse (a clock audit)."""
    return f"by this server's clock, which reads {_utc(now)}: if that is wrong, fix its time sync"


def _end_of(cert: Path) -> float | None:
    """When the certificate ends, in seconds since the epoch; None when that cannot be read."""
    dates = _dates(cert)
    try:
        return None if dates is None else ssl.cert_time_to_seconds(dates[1])
    except ValueError:
        return None


def _validity(cert: Path) -> str:
    """ ", the certificate valid until <date>", or "" when its dates cannot be read."""
    dates = _dates(cert)
    return "" if dates is None else f", the certificate valid until {dates[1]}"


def _check_dates(cert: Path) -> None:
    """Refuses a certificate not valid now (expired, or not yet begun), which every client
    would refuse at its handshake; warns of one that ends soon. Unreadable dates are let be:
    the pair's own check has spoken."""
    dates = _dates(cert)
    if dates is None:
        return
    not_before, not_after = dates
    try:
        begins, ends = ssl.cert_time_to_seconds(not_before), ssl.cert_time_to_seconds(not_after)
    except ValueError:
        return
    now = wall_clock()
    if now > ends:
        raise OSError(f"--tls-cert {cert} expired on {not_after}: clients would refuse it ({_clock_reads(now)})")
    if now + CLOCK_SKEW_SECONDS < begins:
        raise OSError(
            f"--tls-cert {cert} is not valid before {not_before}: clients would refuse it ({_clock_reads(now)})"
        )
    if ends - now < EXPIRY_WARNING_SECONDS:
        log.warning("--tls-cert %s expires on %s: renew it (new connections take a renewed one)", cert, not_after)


def _check_authorities(client_ca: Path) -> None:
    """Refuses a bundle that holds no certificate; warns of one that holds no CA (a server's own
    certificate given by mistake, say), which lets in no client that a CA issued a certificate,
    only one presenting one of those very certificates: every other handshake failed with no
    word on the server's side (gRPC makes it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=client_ca)
    except (ssl.SSLError, OSError) as exc:
        raise OSError(f"--tls-client-ca {client_ca} holds no CA certificates in PEM ({exc})") from None
    held = context.cert_store_stats()
    if held["x509_ca"] == 0:
        log.warning(
            "--tls-client-ca %s holds no CA certificate, only %d leaf certificate(s): a client is let in only if "
            "it presents one of those very certificates, never one a CA issued; give the CA that issues your "
            "clients' certificates",
            client_ca,
            held["x509"],
        )
