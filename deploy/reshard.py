#!/usr/bin/env python3
"""Plan (and run) the object moves of a re-shard behind nginx: which objects change owner when the
upstream list changes from --old to --new, and `sessions-server move-object` for each.

    python deploy/reshard.py --old 10.0.0.1:50051,10.0.0.2:50051 \
        --new 10.0.0.1:50051,10.0.0.2:50051,10.0.0.3:50051 [--execute] [--token T] [--tls-ca PEM]

Server names are the nginx upstream `server` names, exactly as written in nginx.conf and in the
ring files; they are also the addresses this tool connects to (pass --connect NAME=ADDRESS when the
operator reaches a shard under another address). Lists every object on every old shard
(ListObjects), computes old and new owners with the shards' own ring code
(sessions_server.domain.placement), prints the moves, and with --execute runs them, grouped by
(source, destination), via `sessions-server move-object`. Run it between step 1 (new shard up with
the new ring) and step 3 (nginx reloaded) of docs/operations.md, "Adding a shard"; to take a shard
away, as steps 2 and 4 of "Removing a shard".
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import grpc

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.placement import KetamaRing, routing_key

BATCH_SIZE = 100
"""Objects per `move-object` run."""


class Tls(NamedTuple):
    """How the shards are reached when they speak TLS: `move-object`'s flags, and their files'
    contents for the listing."""

    flags: list[str]
    credentials: grpc.ChannelCredentials


def tls_from(system_roots: bool, ca: Path | None, cert: Path | None, key: Path | None) -> Tls | None:
    if not (system_roots or ca or cert or key):
        return None
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    flags = ["--tls"] if system_roots else []
    for flag, path in (("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)):
        if path is not None:
            flags += [flag, str(path)]
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes() if ca else None,
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    return Tls(flags, credentials)


def list_objects(address: str, token: str | None = None, tls: Tls | None = None) -> Iterator[str]:
    """Every object key a shard holds (ListObjects, paginated)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    channel = grpc.secure_channel(address, tls.credentials) if tls else grpc.insecure_channel(address)
    with channel:
        stub = pb_grpc.SessionServiceStub(channel)
        page = ""
        while True:
            response = stub.ListObjects(pb.ListObjectsRequest(page_size=1000, page_token=page), metadata=metadata)
            yield from response.object_keys
            page = response.next_page_token
            if not page:
                return


def plan_moves(
    old: list[str],
    new: list[str],
    connect: dict[str, str] | None = None,
    token: str | None = None,
    tls: Tls | None = None,
) -> dict[tuple[str, str], list[str]]:
    """{(source, destination): [object keys]} for every object whose owner changes."""
    connect = connect or {}
    new_ring = KetamaRing.of(new)
    moves: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source in old:
        for key in list_objects(connect.get(source, source), token, tls):
            owner = new_ring.owner(routing_key(key))
            if owner != source:
                moves[(source, owner)].append(key)
    return dict(moves)


class FailedBatch(NamedTuple):
    """One `move-object` run that did not move all its objects (its own messages say which and why)."""

    source: str
    destination: str
    keys: list[str]
    detail: str


def run_moves(
    moves: dict[tuple[str, str], list[str]],
    connect: dict[str, str] | None = None,
    token: str | None = None,
    *,
    replace: bool = False,
    tls: Tls | None = None,
) -> list[FailedBatch]:
    """Runs `sessions-server move-object` for every group, 100 objects a run. A run that fails does
    not stop the others (move-object itself goes on past an object that fails and names each one);
    returns the runs that failed. Objects moved are no longer listed by their old shard, so running
    the re-shard again retries only what is left."""
    connect = connect or {}
    server = shutil.which("sessions-server")
    base = [server] if server else [sys.executable, "-m", "sessions_server.cli"]
    failed: list[FailedBatch] = []
    for (source, destination), keys in sorted(moves.items()):
        for start in range(0, len(keys), BATCH_SIZE):
            batch = keys[start : start + BATCH_SIZE]
            command = [*base, "move-object", "--from", connect.get(source, source)]
            command += ["--to", connect.get(destination, destination)]
            # One argument each: a key may start with "-", which taken alone reads as an option
            # (the run failed, and its whole batch with it).
            command += [f"--object-key={key}" for key in batch]
            if token:
                command += ["--token", token]
            if replace:
                command.append("--replace")
            if tls:
                command += tls.flags
            sys.stdout.flush()  # the child's lines come after ours
            try:
                code = subprocess.run(command, check=False).returncode
            except OSError as exc:  # the command could not be started at all
                failed.append(FailedBatch(source, destination, batch, f"move-object could not run: {exc}"))
                continue
            if code != 0:
                detail = f"move-object exited with {code}" if code > 0 else f"move-object killed by signal {-code}"
                failed.append(FailedBatch(source, destination, batch, detail))
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="comma-separated upstream names before the change")
    parser.add_argument("--new", required=True, help="comma-separated upstream names after the change")
    parser.add_argument("--connect", action="append", default=[], help="NAME=ADDRESS to reach a shard")
    parser.add_argument("--token", help='bearer token valid on every shard, granting every key (prefix "")')
    parser.add_argument("--execute", action="store_true", help="run the moves (default: only print them)")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="overwrite objects a new owner already holds (copies an earlier, cut-short run left there)",
    )
    tls = parser.add_argument_group("TLS", "plaintext unless one of these is given; they apply to every shard")
    tls.add_argument("--tls", action="store_true", help="use TLS, trusting the system's root certificates")
    tls.add_argument("--tls-ca", type=Path, metavar="PEM", help="use TLS, trusting these CA certificates instead")
    tls.add_argument("--tls-cert", type=Path, metavar="PEM", help="client certificate chain (mTLS)")
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    args = parser.parse_args(argv)
    connect = dict(item.split("=", 1) for item in args.connect)
    old, new = args.old.split(","), args.new.split(",")
    try:
        shard_tls = tls_from(args.tls, args.tls_ca, args.tls_cert, args.tls_key)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    try:
        moves = plan_moves(old, new, connect, args.token, shard_tls)
    except grpc.RpcError as error:  # a shard unreachable, or refusing the listing
        code = error.code().name if isinstance(error, grpc.Call) else "ERROR"
        details = error.details() if isinstance(error, grpc.Call) else str(error)
        print(f"reshard: listing the objects of the old shards failed: {code}: {details}", file=sys.stderr)
        return 1
    total = sum(len(keys) for keys in moves.values())
    for (source, destination), keys in sorted(moves.items()):
        print(f"{source} -> {destination}: {len(keys)} objects")
    print(f"{total} objects change owner", flush=True)
    if not (args.execute and moves):
        return 0
    failed = run_moves(moves, connect, args.token, replace=args.replace, tls=shard_tls)
    if not failed:
        print(f"all {total} moves done")
        return 0
    print(
        f"reshard: {len(failed)} move-object run(s) did not move all their objects "
        f"({sum(len(batch.keys) for batch in failed)} objects in them; the failed ones and why are "
        "named above); every other run was done:",
        file=sys.stderr,
    )
    for batch in failed:
        where = f"{batch.source} -> {batch.destination}"
        print(f"  {where}: a run of {len(batch.keys)} objects: {batch.detail}", file=sys.stderr)
    print(
        "reshard: fix the causes (an object locked by a move that was cut short: `sessions-server abort-move "
        "--from SOURCE`), "
        "then run this again: objects already moved are not listed again",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
