#!/usr/bin/env python3
"""Plan (and run) the object moves of a re-shard behind nginx: which objects change owner when the
upstream list changes from --old to --new, and `sessions-server move-object` for each.

    python deploy/reshard.py --old 10.0.0.1:50051,10.0.0.2:50051 \
        --new 10.0.0.1:50051,10.0.0.2:50051,10.0.0.3:50051 [--execute] [--token T]

Server names are the nginx upstream `server` names, exactly as written in nginx.conf and in the
ring files; they are also the addresses this tool connects to (pass --connect NAME=ADDRESS when the
operator reaches a shard under another address). Lists every object on every old shard
(ListObjects), computes old and new owners with the shards' own ring code
(sessions_server.domain.placement), prints the moves, and with --execute runs them, grouped by
(source, destination), via `sessions-server move-object`. Run it between step 1 (new shard up with
the new ring) and step 3 (nginx reloaded) of docs/operations.md, "Adding a shard".
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator

import grpc

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.placement import KetamaRing, routing_key


def list_objects(address: str, token: str | None = None) -> Iterator[str]:
    """Every object key a shard holds (ListObjects, paginated)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        page = ""
        while True:
            response = stub.ListObjects(pb.ListObjectsRequest(page_size=1000, page_token=page), metadata=metadata)
            yield from response.object_keys
            page = response.next_page_token
            if not page:
                return


def plan_moves(
    old: list[str], new: list[str], connect: dict[str, str] | None = None, token: str | None = None
) -> dict[tuple[str, str], list[str]]:
    """{(source, destination): [object keys]} for every object whose owner changes."""
    connect = connect or {}
    new_ring = KetamaRing.of(new)
    moves: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source in old:
        for key in list_objects(connect.get(source, source), token):
            owner = new_ring.owner(routing_key(key))
            if owner != source:
                moves[(source, owner)].append(key)
    return dict(moves)


def run_moves(
    moves: dict[tuple[str, str], list[str]], connect: dict[str, str] | None = None, token: str | None = None
) -> None:
    connect = connect or {}
    server = shutil.which("sessions-server")
    base = [server] if server else [sys.executable, "-m", "sessions_server.cli"]
    for (source, destination), keys in sorted(moves.items()):
        for start in range(0, len(keys), 100):
            command = [*base, "move-object", "--from", connect.get(source, source)]
            command += ["--to", connect.get(destination, destination)]
            for key in keys[start : start + 100]:
                command += ["--object-key", key]
            if token:
                command += ["--token", token]
            subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="comma-separated upstream names before the change")
    parser.add_argument("--new", required=True, help="comma-separated upstream names after the change")
    parser.add_argument("--connect", action="append", default=[], help="NAME=ADDRESS to reach a shard")
    parser.add_argument("--token", help="bearer token valid on every shard")
    parser.add_argument("--execute", action="store_true", help="run the moves (default: only print them)")
    args = parser.parse_args(argv)
    connect = dict(item.split("=", 1) for item in args.connect)
    old, new = args.old.split(","), args.new.split(",")
    moves = plan_moves(old, new, connect, args.token)
    total = sum(len(keys) for keys in moves.values())
    for (source, destination), keys in sorted(moves.items()):
        print(f"{source} -> {destination}: {len(keys)} objects")
    print(f"{total} objects change owner")
    if args.execute and moves:
        run_moves(moves, connect, args.token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
