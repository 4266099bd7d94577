#!/usr/bin/env bash
# Rebuild a Sessions shard's data directory (or one object) from its Litestream replica.
#
#   restore.sh --replica REPLICA --data-dir DIR [--object-key KEY]... [--timestamp RFC3339]
#              [--endpoint URL] [--region R] [--jobs N] [--force] [--integrity-check none|quick|full]
#              [--skip-missing]
#
# REPLICA is the shard's replica root as configured in litestream.yml, without the trailing
# /objects: s3://BUCKET/PREFIX (with --endpoint for a non-AWS store), or file:///PATH / a plain path
# (litestream-file.yml). Every object is restored to DIR/objects/ab/cd/<sha256 of key>.sqlite,
# exactly where the server looks for it. Without --object-key, every object found in the replica
# is restored (S3 listing uses Python with boto3: PYTHON=/path/to/python if not python3). With
# --timestamp, each object is restored to its state at that time (point-in-time recovery; objects
# created after it are skipped, objects unchanged since are restored as they are now: telling
# which needs Python, with boto3 for S3). Run it with the shard's server STOPPED (or on a fresh
# directory; it refuses a directory a running server owns), then start the server on DIR.
# --skip-missing: an object with nothing in the replica yet is skipped instead of failing the run.
# Needs `litestream` (v0.5) on PATH or LITESTREAM=/path/to/litestream.
set -euo pipefail

LITESTREAM=${LITESTREAM:-litestream}
PYTHON=${PYTHON:-python3}
replica="" data_dir="" timestamp="" endpoint="" region="us-east-1" jobs=8 force="" check="quick" skip=""
keys=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --replica) replica=$2; shift 2 ;;
        --data-dir) data_dir=$2; shift 2 ;;
        --object-key) keys+=("$2"); shift 2 ;;
        --timestamp) timestamp=$2; shift 2 ;;
        --endpoint) endpoint=$2; shift 2 ;;
        --region) region=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        --force) force=1; shift ;;
        --skip-missing) skip=1; shift ;;
        --integrity-check) check=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "restore.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ -n "$replica" && -n "$data_dir" ]] || { echo "restore.sh: --replica and --data-dir are required" >&2; exit 2; }
replica=${replica%/}
# Litestream 0.5.18's S3 client fails to start when AWS_CA_BUNDLE is set ("unable to add custom
# RootCAs HTTPClient"); it uses the system roots, so the variable is dropped for it.
unset AWS_CA_BUNDLE

# The file name of an object: hex SHA-256 of its UTF-8 key, fanned out as ab/cd/ (storage/paths.py).
relative_path() {
    local name
    name=$(printf '%s' "$1" | sha256sum | cut -c1-64).sqlite
    printf '%s/%s/%s' "${name:0:2}" "${name:2:2}" "$name"
}

# Every object in the replica, as relative paths ab/cd/<sha>.sqlite.
list_replica() {
    case "$replica" in
        s3://*)
            "$PYTHON" - "$replica" "$endpoint" "$region" <<'EOF'
import re, sys
import boto3
url, endpoint, region = sys.argv[1:4]
bucket, _, prefix = url[len("s3://"):].partition("/")
prefix = (prefix.strip("/") + "/objects/").lstrip("/")
s3 = boto3.client("s3", endpoint_url=endpoint or None, region_name=region)
pattern = re.compile(r"([0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{64}\.sqlite)/")
found = set()
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for item in page.get("Contents", []):
        match = pattern.match(item["Key"][len(prefix):])
        if match:
            found.add(match.group(1))
print("\n".join(sorted(found)))
EOF
            ;;
        *)
            local root=${replica#file://}
            [[ -d "$root/objects" ]] || return 0
            (cd "$root/objects" && find . -mindepth 3 -maxdepth 3 -type d -name '*.sqlite' | sed 's#^\./##' | sort)
            ;;
    esac
}

source_url() {  # the replica URL of one object
    case "$replica" in
        s3://*)
            local query="region=$region"
            [[ -n "$endpoint" ]] && query="endpoint=$endpoint&$query"
            printf '%s/objects/%s?%s' "$replica" "$1" "$query" ;;
        file://*) printf '%s/objects/%s' "$replica" "$1" ;;
        *) printf 'file://%s/objects/%s' "$(cd "$replica" && pwd)" "$1" ;;
    esac
}

restore_one() {  # relative path -> DIR/objects/<relative path>
    local rel=$1 target="$data_dir/objects/$1" output
    mkdir -p "$(dirname "$target")"
    local args=(restore -integrity-check "$check" -o "$target")
    [[ -n "$timestamp" ]] && args+=(-timestamp "$timestamp")
    [[ -n "$force" ]] && args+=(-force)
    [[ -n "$skip" ]] && args+=(-if-replica-exists)
    if ! output=$("$LITESTREAM" "${args[@]}" "$(source_url "$rel")" 2>&1); then
        # Either when Litestream's time bounds (upload times) and its plan (transaction times)
        # disagree about a time near the object's first or oldest file.
        if [[ -n "$timestamp" && ( "$output" == *"timestamp does not exist"* \
              || "$output" == *"no matching backup files available"* ) ]]; then
            restore_dated "$rel" "$target"
            return
        fi
        if [[ -n "$skip" && "$output" == *"no backups found"* ]]; then  # what a timestamp makes of it
            echo "skipped $rel: nothing in the replica" >&2
            return 0
        fi
        echo "restore of $rel failed: $output" >&2
        return 1
    fi
    if [[ -n "$skip" && "$output" == *"no matching backups found"* ]]; then  # -if-replica-exists
        echo "skipped $rel: nothing in the replica" >&2
        return 0
    fi
    echo "restored $rel"
}

# Litestream 0.5 refuses a timestamp outside the times of an object's replicated files: after
# the newest (nothing changed since: the object is as it is now) as well as before the first
# (it did not exist yet). The replica's own files tell which (`STATE_AT`), and the object is
# restored up to the newest transaction made by then, which a replicator still running cannot
# move past.
restore_dated() {
    local rel=$1 target=$2 url listing at output base
    url=$(source_url "$rel")
    case "$replica" in
        s3://*) base="$replica/objects/$rel" ;;
        file://*) base="${replica#file://}/objects/$rel" ;;
        *) base="$(cd "$replica" && pwd)/objects/$rel" ;;
    esac
    local tries
    for tries in 1 2 3; do  # again when a replicator still running let a listed file go meanwhile
        if ! listing=$("$LITESTREAM" ltx -level all -json "$url" 2>&1); then
            echo "restore of $rel failed: listing its replica: $listing" >&2
            return 1
        fi
        # Its last line only: Python's warnings go to stderr, and the answer is printed last.
        at=$("$PYTHON" -c "$STATE_AT" "$timestamp" "$base" "$endpoint" "$region" <<<"$listing" | tail -n 1)
        [[ "$at" == "listed file gone"* ]] || break
    done
    case "$at" in
        none)
            echo "skipped $rel: created after $timestamp" >&2
            return 0 ;;
        txid\ *)
            local args=(restore -integrity-check "$check" -o "$target" -txid "${at#txid }")
            [[ -n "$force" ]] && args+=(-force)
            if ! output=$("$LITESTREAM" "${args[@]}" "$url" 2>&1); then
                echo "restore of $rel failed: $output" >&2
                return 1
            fi
            echo "restored $rel (as of transaction ${at#txid })" ;;
        *)
            echo "restore of $rel failed: ${at:-deciding its state at $timestamp failed (see above)}" >&2
            return 1 ;;
    esac
}

# Reads `litestream ltx -json` (every level) for the timestamp argv[1] and prints the newest
# transaction made by then ("txid X"), "none" when the object was created after it, or why
# neither can be told. A file's header holds the time of its newest transaction (Unix ms, bytes
# 32-39; a compacted file's is its newest input's), so along the files in transaction order the
# header times never go back: a binary search finds the last file made by the timestamp, reading
# few headers. The listing's time (to the second) is when a file was written to the replica, at
# or after its header's: a file listed a second before the timestamp needs no read. A snapshot's
# time is when it was taken, not when its transactions were made: it counts when taken by the
# timestamp, and "none" needs the object's first transaction in a file of another level.
# argv[2]: the object's replica (s3://... or a directory); argv[3], argv[4]: the S3 endpoint and
# region (reading headers there needs boto3).
STATE_AT='
import json, os, re, sys
from datetime import datetime, timedelta, timezone

SNAPSHOT_LEVEL = 9

def when(text):  # RFC 3339, as Litestream takes it (Python before 3.11 reads less)
    text = re.sub(r"[zZ]$", "+00:00", text.strip())
    text = re.sub(r"\.(\d+)", lambda m: "." + (m.group(1) + "000000")[:6], text)
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

def written(item):  # the two clients lay levels out differently
    name = "%s-%s.ltx" % (item["min_txid"], item["max_txid"])
    base, endpoint, region = sys.argv[2:5]
    if base.startswith("s3://"):
        import boto3
        bucket, _, prefix = base[len("s3://"):].partition("/")
        key = "%s/%04x/%s" % (prefix, item["level"], name)
        s3 = boto3.client("s3", endpoint_url=endpoint or None, region_name=region)
        head = s3.get_object(Bucket=bucket, Key=key, Range="bytes=32-39")["Body"].read()
    else:
        with open(os.path.join(base, "ltx", str(item["level"]), name), "rb") as ltx:
            ltx.seek(32)
            head = ltx.read(8)
    return datetime.fromtimestamp(int.from_bytes(head, "big") / 1000, timezone.utc)

def made_by(item, at):
    return when(item["timestamp"]) + timedelta(seconds=1) <= at or written(item) <= at

def gone(error):
    return isinstance(error, FileNotFoundError) or type(error).__name__ == "NoSuchKey"

def last_made(items, at):  # items in transaction order, made ones first
    low, high = 0, len(items)
    while low < high:
        middle = (low + high) // 2
        if made_by(items[middle], at):
            low = middle + 1
        else:
            high = middle
    return items[low - 1] if low else None

at = when(sys.argv[1])
files = json.load(sys.stdin) or []
regular = sorted((f for f in files if f["level"] < SNAPSHOT_LEVEL), key=lambda f: (f["max_txid"], f["level"]))
try:
    made = [last_made(regular, at)] + [f for f in files if f["level"] >= SNAPSHOT_LEVEL and made_by(f, at)]
except Exception as error:
    if not gone(error):
        raise
    print("listed file gone: " + str(error))
    sys.exit()
made = [f for f in made if f is not None]
if not files:
    print("its replica holds no files")
elif made:
    print("txid " + max(f["max_txid"] for f in made))
elif any(int(f["min_txid"], 16) == 1 for f in regular):
    print("none")
else:
    oldest = min(f["timestamp"] for f in files)
    print("its replica holds no state of it from before " + oldest + " (older files were let go by "
          "retention): restore it without --timestamp, or with a later one")
'

mkdir -p "$data_dir/objects"
# The data directory's lock, as a server takes it (storage/datadir.py): refused while a server
# owns DIR, and held until the restore ends (the jobs inherit it), so none starts on a half-restored
# directory. Without flock(1) (util-linux) the check is skipped, with a warning.
if command -v flock >/dev/null; then
    exec 9<>"$data_dir/LOCK"
    if ! flock -n 9; then
        echo "restore.sh: data directory $data_dir is in use by $(head -c 512 "$data_dir/LOCK" | head -n 1): stop it first" >&2
        exit 1
    fi
    truncate -s 0 "$data_dir/LOCK" && printf 'pid %d (restore.sh)\n' "$$" >&9
else
    echo "restore.sh: flock not found: not checking that no server owns $data_dir" >&2
fi
if [[ ${#keys[@]} -gt 0 ]]; then
    paths=()
    for key in "${keys[@]}"; do paths+=("$(relative_path "$key")"); done
else
    mapfile -t paths < <(list_replica)
fi
[[ ${#paths[@]} -gt 0 ]] || { echo "restore.sh: nothing to restore in $replica" >&2; exit 1; }

export -f restore_one restore_dated source_url
export LITESTREAM PYTHON STATE_AT replica data_dir timestamp endpoint region force check skip
start=$(date +%s.%N)
status=0
printf '%s\n' "${paths[@]}" | xargs -P "$jobs" -I{} bash -c 'restore_one "$1"' _ {} || status=$?
end=$(date +%s.%N)
awk -v n="${#paths[@]}" -v d="$data_dir" -v s="$start" -v e="$end" \
    'BEGIN { printf "restore.sh: %d object(s) into %s in %.2f s\n", n, d, e - s }' >&2
if [[ $status -ne 0 ]]; then
    echo "restore.sh: some objects failed (see above); the others were restored" >&2
    exit 1
fi
