"""A Java program with stubs generated from proto/ alone (tests/clients/java, Maven) uses real
servers as docs/raw-stubs.md tells any language to: the routing header's exact spelling (and a
shard refusing Java's URLEncoder's), packed history, a large message sent and read in pieces,
error details read with grpc-java's StatusProto, and a subscription resumed from the revision it
saw, compared as unsigned."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import start_server

PROJECT = Path(__file__).resolve().parent / "java"
CHECKS = ["ok append", "ok history", "ok large", "ok errors", "ok subscribe", "ok routing tenant%20a%2F%2A~%C3%BC"]


def _maven() -> str:
    found = shutil.which("mvn")
    assert found is not None and shutil.which("java") is not None, (
        "Maven and a JDK run this test: .ci/run installs them (apt-get install maven default-jdk-headless)"
    )
    return found


def _build(maven: str, out: Path) -> str:
    """Generates the stubs, compiles the program; returns its classpath."""
    classpath_file = out / "classpath.txt"
    command = [maven, "-q", "-B", "compile", "dependency:build-classpath", f"-Dmdep.outputFile={classpath_file}"]
    result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return f"{PROJECT / 'target' / 'classes'}{os.pathsep}{classpath_file.read_text().strip()}"


@pytest.mark.timeout(1200)  # a cold Maven build downloads gRPC's jars (its own bound is 900 s)
def test_a_java_program_with_generated_stubs_follows_the_raw_stubs_guide(tmp_path: Path) -> None:
    classpath = _build(_maven(), tmp_path)
    server = start_server(tmp_path / "server")
    shard = start_server(tmp_path / "shard", require_routing_header=True)
    try:
        result = subprocess.run(
            ["java", "-cp", classpath, "sessions.rawstubs.RawStubs", server.address, shard.address],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
        shard.stop()
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert [line.split(" ")[1] for line in lines] == [check.split(" ")[1] for check in CHECKS]
    assert lines[-1].startswith(CHECKS[-1] + "%20")  # the spelling the guide gives for that key
