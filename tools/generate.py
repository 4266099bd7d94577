"""Regenerates the Python stubs under clients/python/sessions_proto from proto/.

`python tools/generate.py` rewrites the committed output; `--check` regenerates into a temporary
directory and fails when the committed files differ (CI runs it through `make check-generated`).
The stubs live in their own package, `sessions_proto`, imported by the server's transport layer
and by the Python client; protoc's absolute imports are rewritten to that package.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_PACKAGE = "sessions/v1"
OUTPUT = ROOT / "clients" / "python" / "sessions_proto"
PYTHON_IMPORT = "sessions_proto.v1"


def _protoc(out_dir: Path) -> None:
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))
    plugin_dir = Path(sys.executable).parent
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *sources,
    ]
    subprocess.run(cmd, check=True, cwd=PROTO_ROOT)


def _descriptor_set(tmp: Path) -> bytes:
    """The contract as a FileDescriptorSet with source info, so reflection shows the comments."""
    out = tmp / "sessions.binpb"
    buf = Path(sys.executable).parent / "buf"
    subprocess.run([str(buf), "build", "-o", str(out), "--path", f"proto/{PROTO_PACKAGE}"], check=True, cwd=ROOT)
    return out.read_bytes()


def _render(tmp: Path) -> dict[str, str | bytes]:
    """Runs protoc and returns the package's files (relative path -> content), imports rewritten."""
    _protoc(tmp)
    files: dict[str, str | bytes] = {
        "__init__.py": '"""Generated protobuf and gRPC stubs for the sessions contract."""\n',
        "v1/__init__.py": '"""Generated stubs for sessions.v1 (do not edit; run `make generate`)."""\n',
        "py.typed": "",
    }
    for path in sorted((tmp / PROTO_PACKAGE).iterdir()):
        text = path.read_text()
        text = text.replace("from sessions.v1 import", f"from {PYTHON_IMPORT} import")
        text = text.replace("import sessions.v1.", f"import {PYTHON_IMPORT}.")
        files[f"v1/{path.name}"] = text
    files["v1/sessions_descriptor.binpb"] = _descriptor_set(tmp)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed output differs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wanted = _render(Path(tmp))
    if args.check:
        existing: dict[str, str | bytes] = {
            str(p.relative_to(OUTPUT)): p.read_bytes() if p.suffix == ".binpb" else p.read_text()
            for p in OUTPUT.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        if existing == wanted:
            print("generated code is up to date")
            return 0
        for name in sorted(set(existing) | set(wanted)):
            old, new = existing.get(name, ""), wanted.get(name, "")
            if old != new:
                if isinstance(old, bytes) or isinstance(new, bytes):
                    print(f"{name}: binary content differs")
                    continue
                diff = difflib.unified_diff(
                    old.splitlines(),
                    new.splitlines(),
                    f"committed/{name}",
                    f"generated/{name}",
                    lineterm="",
                    n=1,
                )
                print("\n".join(list(diff)[:40]))
        print("generated code differs from proto/: run `make generate` and commit", file=sys.stderr)
        return 1
    if OUTPUT.exists():
        shutil.rmtree(OUTPUT)
    for name, text in wanted.items():
        target = OUTPUT / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text)
    print(f"wrote {len(wanted)} files to {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
