"""Which shard owns an object key: the ownership guard's view of the proxy's routing.

A shard told its place refuses keys it does not own (FAILED_PRECONDITION, OBJECT_NOT_OWNED), so
a misrouted write never forks an object. Two schemes match what the proxies do with the
`x-object-key` header (the percent-encoded key, as clients send it):

- `nginx-ketama`: nginx's `hash $http_x_object_key consistent` — a ring of 160 CRC32 points per
  weight-1 server, point j = crc32(host NUL port + previous point as 4 little-endian bytes); a
  key maps to the first point at or after crc32(key), wrapping around.
- `modulo`: nginx's plain `hash $http_x_object_key` with equal weights: bits 16–30 of
  crc32(key), mod the number of servers, index into the servers **in the order nginx.conf lists
  them** (for this scheme the order of `shards` matters).
"""

from __future__ import annotations

import bisect
import json
import struct
import urllib.parse
import zlib
from dataclasses import dataclass
from pathlib import Path

from sessions_server.domain.errors import FailedPrecondition

POINTS_PER_SERVER = 160


def routing_key(object_key: str) -> bytes:
    """The bytes a proxy hashes: the header value clients send."""
    return urllib.parse.quote(object_key, safe="").encode("ascii")


@dataclass(frozen=True)
class KetamaRing:
    """nginx's consistent-hash ring over upstream server names ("host:port")."""

    points: tuple[int, ...]
    owners: tuple[str, ...]

    @classmethod
    def of(cls, servers: list[str]) -> KetamaRing:
        placed: list[tuple[int, str]] = []
        for server in servers:
            host, _, port = server.rpartition(":") if ":" in server else (server, "", "")
            base = host.encode() + b"\x00" + port.encode()
            previous = 0
            for _ in range(POINTS_PER_SERVER):
                point = zlib.crc32(base + struct.pack("<I", previous))
                placed.append((point, server))
                previous = point
        placed.sort(key=lambda entry: entry[0])
        unique: list[tuple[int, str]] = []
        for point, server in placed:
            if not unique or unique[-1][0] != point:
                unique.append((point, server))
        return cls(tuple(p for p, _ in unique), tuple(s for _, s in unique))

    def owner(self, key: bytes) -> str:
        index = bisect.bisect_left(self.points, zlib.crc32(key))
        return self.owners[index % len(self.points)]


@dataclass(frozen=True)
class Placement:
    """This shard's identity and the scheme that maps keys to shards."""

    scheme: str
    shards: tuple[str, ...]
    me: str
    ring: KetamaRing | None = None

    @classmethod
    def from_ring_file(cls, path: Path) -> Placement:
        """Reads {"scheme": "nginx-ketama"|"modulo", "shards": ["host:port", ...], "self": "host:port"}."""
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read ring file {path}: {exc}") from None
        scheme = document.get("scheme", "nginx-ketama")
        shards = document.get("shards")
        me = document.get("self")
        if scheme not in ("nginx-ketama", "modulo"):
            raise ValueError(f'ring file {path}: scheme must be "nginx-ketama" or "modulo"')
        if not isinstance(shards, list) or not shards or not all(isinstance(s, str) for s in shards):
            raise ValueError(f"ring file {path}: shards must be a non-empty list of server names")
        if me not in shards:
            raise ValueError(f"ring file {path}: self ({me!r}) must be one of the shards")
        ring = KetamaRing.of(shards) if scheme == "nginx-ketama" else None
        return cls(scheme, tuple(shards), me, ring)

    def owner(self, object_key: str) -> str:
        key = routing_key(object_key)
        if self.ring is not None:
            return self.ring.owner(key)
        return self.shards[((zlib.crc32(key) >> 16) & 0x7FFF) % len(self.shards)]

    def check(self, object_key: str) -> None:
        owner = self.owner(object_key)
        if owner != self.me:
            raise FailedPrecondition(
                f"this shard ({self.me}) does not own the object; its owner is {owner} — check the proxy's routing",
                reason="OBJECT_NOT_OWNED",
                owner=owner,
            )
