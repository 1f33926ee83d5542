"""deploy/systemd and deploy/nginx: the status page's unit beside the agent's, and the TLS
reverse proxy in front of it, say what the server needs (a token, an address that is not
loopback, the agent's credentials for Retry) and what `beamflow serve` accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from beamflow.cli import app

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD = ROOT / "deploy" / "systemd"


def unit(path: Path) -> dict[str, list[str]]:
    """KEY -> values (systemd allows a key more than once) of a unit file."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_status_unit_runs_serve_off_loopback_with_a_token_and_the_agents_credentials():
    status = unit(SYSTEMD / "beamflow-status.service")
    agent = unit(SYSTEMD / "beamflow-agent.service")
    assert status["User"] == agent["User"] == ["beamflow"]
    assert status["WorkingDirectory"] == agent["WorkingDirectory"]
    assert "/etc/beamflow/status.env" in status["EnvironmentFile"]  # the token, required
    assert "-/etc/beamflow/agent.env" in status["EnvironmentFile"]  # Retry acts as the agent
    argv = shlex.split(status["ExecStart"][0])
    assert argv[0] == agent["ExecStart"][0].split()[0]  # the same installation
    assert argv[1] == "serve"
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert options["--config"] == "/srv/beamflow/beamflow.toml"
    assert not options["--host"].startswith("127.")
    help_text = CliRunner().invoke(app, ["serve", "--help"]).output
    for option in options:
        assert option in help_text, option
    assert status["Restart"] == ["on-failure"] and status["WantedBy"] == ["multi-user.target"]


def test_the_proxy_terminates_tls_and_forwards_to_the_served_address():
    conf = (ROOT / "deploy" / "nginx" / "beamflow-status.conf").read_text()
    body = "\n".join(line.split("#")[0] for line in conf.splitlines())
    assert re.search(r"listen 443 ssl;", body) and "ssl_certificate " in body
    assert "return 301 https://" in body  # plain HTTP only redirects
    (upstream,) = re.findall(r"server\s+([\d.]+):(\d+);", body)
    assert not upstream[0].startswith("127.") and upstream[1] == "8765"
    assert "proxy_pass http://beamflow_status;" in body
    assert "proxy_buffering off;" in body  # products stream


def test_the_guide_points_at_both():
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert "deploy/systemd/beamflow-status.service" in guide
    assert "deploy/nginx/beamflow-status.conf" in guide
