"""deploy/systemd and deploy/nginx: the status page's unit beside the agent's, and the TLS
reverse proxy in front of it, say what the server needs (a token, an address that is not
loopback, the agent's credentials for Retry) and what `beamflow serve` accepts; the agent's
environment file is read by systemd alone (the units, and beamflow-as-agent for a command
run as the agent); the proxy works on RHEL 8/9's nginx; `beamflow init` keeps state/ private."""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import ConfigError, _check_environment

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
    assert re.search(r"listen 443 ssl http2;", body) and "ssl_certificate " in body
    # `http2 on;` needs nginx 1.25.1; RHEL 8/9 ship 1.14-1.24: the file says what to change.
    assert "http2 on" not in body and "1.25.1" in conf
    assert "return 301 https://" in body  # plain HTTP only redirects
    (upstream,) = re.findall(r"server\s+([\d.]+):(\d+);", body)
    assert not upstream[0].startswith("127.") and upstream[1] == "8765"
    assert "proxy_pass http://beamflow_status;" in body
    assert "proxy_buffering off;" in body  # products stream


def test_the_guide_points_at_both():
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert "deploy/systemd/beamflow-status.service" in guide
    assert "deploy/nginx/beamflow-status.conf" in guide


def test_the_agent_env_example_is_an_environment_file_of_known_settings():
    """Comments and KEY=VALUE lines (systemd's EnvironmentFile rules); every key is a
    beamflow setting, and the docs never feed the file to a shell (`env $(cat ...)` breaks
    on its comment lines)."""
    lines = (SYSTEMD / "agent.env.example").read_text().splitlines()
    assert lines[0].startswith("#")
    values = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert set(values) == {"BEAMFLOW_GLOBUS__CLIENT_ID", "BEAMFLOW_GLOBUS__CLIENT_SECRET"}
    _check_environment(values)  # raises ConfigError for a key beamflow does not know
    try:
        _check_environment({**values, "BEAMFLOW_GLOBUS__CLIENT_SECRT": "x"})
    except ConfigError:
        pass
    else:
        raise AssertionError("a misspelt key must be refused")
    for doc in (ROOT / "docs" / "deployment.md", ROOT / "deploy" / "README.md",
                ROOT / "docs" / "operations.md"):
        assert "env $(" not in doc.read_text(), doc


def test_beamflow_as_agent_runs_the_command_as_the_agent_unit_does():
    agent = unit(SYSTEMD / "beamflow-agent.service")
    script = SYSTEMD / "beamflow-as-agent"
    assert os.access(script, os.X_OK)
    argv = shlex.split(script.read_text().split("exec ", 1)[1].replace("\\\n", " "))
    assert argv[0] == "systemd-run" and "--wait" in argv  # the command's exit status
    options = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    assert options["--uid"] == agent["User"][0]
    assert options["--working-directory"] == agent["WorkingDirectory"][0]
    env_file = options["--property"].removeprefix("EnvironmentFile=")
    assert "-" + env_file in agent["EnvironmentFile"]
    beamflow = next(a for a in argv if a.endswith("/bin/beamflow"))
    assert beamflow == agent["ExecStart"][0].split()[0]
    assert argv[argv.index(beamflow) + 1] == "$@"
    config = shlex.split(agent["ExecStart"][0])
    assert argv[-2:] == config[config.index("--config"):][:2]


def test_init_makes_state_private(tmp_path):
    old = os.umask(0o022)
    try:
        for backend in ("local", "globus"):
            result = CliRunner().invoke(app, ["init", str(tmp_path / backend), "--backend",
                                              backend])
            assert result.exit_code == 0, result.output
            assert stat.S_IMODE((tmp_path / backend / "state").stat().st_mode) == 0o700
        (tmp_path / "loose" / "state").mkdir(parents=True, mode=0o755)
        assert CliRunner().invoke(app, ["init", str(tmp_path / "loose")]).exit_code == 0
        assert stat.S_IMODE((tmp_path / "loose" / "state").stat().st_mode) == 0o700
    finally:
        os.umask(old)
