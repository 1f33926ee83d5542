"""The status page served beyond loopback, reached from a non-loopback client address.

The test makes its own network: a network namespace and a veth pair (root and `ip` needed;
skipped otherwise, saying why). The server binds the veth address in this namespace; the
client runs inside the new namespace (`ip netns exec`), so its requests come from another
address over a real link, and never leave this machine. Without the token, every page,
preview, API call and download is refused; with it, all work; with the explicit public
viewing opt-in, viewing works without it (and actions still need it).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.server import serve_in_thread

TOKEN = "netns-test-token-0123456789abcdef"
IP = shutil.which("ip")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or IP is None,
    reason="needs root and iproute2's `ip` to create a network namespace and a veth pair "
    + ("(not root)" if os.geteuid() != 0 else "(no `ip` on PATH)"),
)


def ip(*args: str) -> None:
    subprocess.run([IP, *args], check=True, capture_output=True, text=True, timeout=20)


@pytest.fixture(scope="module")
def link() -> Iterator[tuple[str, str, str]]:
    """(namespace, server address, client address): a /30 on a veth pair, one end in a new
    namespace. RFC 2544's benchmarking range, 198.18.0.0/15: never routed anywhere."""
    tag = f"{os.getpid() % 10000}{random.randrange(100, 999)}"
    ns, host_end, ns_end = f"bfns{tag}", f"bfh{tag}", f"bfn{tag}"
    octet = random.randrange(0, 64) * 4
    server, client = f"198.18.{random.randrange(1, 255)}.{octet + 1}", None
    client = server.rsplit(".", 1)[0] + f".{octet + 2}"
    try:
        ip("netns", "add", ns)
    except subprocess.CalledProcessError as exc:  # e.g. a container without CAP_SYS_ADMIN
        pytest.skip(f"cannot create a network namespace: {exc.stderr.strip()}")
    try:
        ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        ip("link", "set", ns_end, "netns", ns)
        ip("addr", "add", f"{server}/30", "dev", host_end)
        ip("link", "set", host_end, "up")
        ip("-n", ns, "addr", "add", f"{client}/30", "dev", ns_end)
        ip("-n", ns, "link", "set", ns_end, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield ns, server, client
    finally:
        subprocess.run([IP, "link", "del", host_end], capture_output=True, timeout=20)
        subprocess.run([IP, "netns", "del", ns], capture_output=True, timeout=20)


# Runs in the namespace: GETs each URL (with the token when asked), reports the status codes
# and the address the requests left from.
CLIENT = r"""
import json, socket, sys, urllib.error, urllib.request
base, token, paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
host, port = base.split("//")[1].split(":")
with socket.create_connection((host, int(port)), timeout=5) as s:
    source = s.getsockname()[0]
out = {"source": source, "codes": {}, "bodies": {}}
for path in paths:
    request = urllib.request.Request(base + path)
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            code, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        code, body = e.code, e.read()
    out["codes"][path] = code
    out["bodies"][path] = body.decode("utf-8", "replace")
print(json.dumps(out))
"""


def from_namespace(ns: str, base: str, paths: list[str], token: str = "") -> dict:
    result = subprocess.run(
        [IP, "netns", "exec", ns, sys.executable, "-c", CLIENT, base, token, json.dumps(paths)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def store(tmp_path: Path) -> tuple[Store, Run]:
    from page_kit import write_png

    store = Store(tmp_path / "state" / "runs.sqlite")
    run = store.create_run(scan_name="unpublished_sample", scan_path="/data/unpublished_sample",
                           flow="ptycho_reconstruct",
                           backend="local", status=RunStatus.ACTIVE)
    preview = write_png(tmp_path / "previews" / "object_phase.png")
    product = tmp_path / "previews" / "product.h5"
    product.write_bytes(b"\x89HDF\r\n\x1a\nsecret reconstruction")
    store.add_previews(run.id, [str(preview)])
    run = store.update_run(run.id, status=RunStatus.SUCCEEDED, product=str(product))
    return store, run


def paths_of(run: Run) -> list[str]:
    return ["/", f"/runs/{run.id}", "/api/runs", f"/api/runs/{run.id}", "/api/agent",
            "/api/openapi.json", f"/files/{run.id}/0", f"/files/{run.id}/object_phase.png",
            f"/files/{run.id}/product"]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_beyond_loopback_everything_needs_the_token(link, store) -> None:
    ns, server, client = link
    store, run = store
    app = create_app(store, StatusOptions(host=server, token=TOKEN))
    with serve_in_thread(app, server) as base:
        denied = from_namespace(ns, base, [*paths_of(run), "/healthz"])
        assert denied["source"] == client  # a real non-loopback client address
        for path in paths_of(run):
            assert denied["codes"][path] in (401, 403), (path, denied["codes"][path])
            assert "unpublished_sample" not in denied["bodies"][path], path
            assert "secret reconstruction" not in denied["bodies"][path], path
        health = json.loads(denied["bodies"]["/healthz"])  # up, and nothing more
        assert denied["codes"]["/healthz"] == 200 and set(health) == {"ok", "version"}

        allowed = from_namespace(ns, base, paths_of(run), token=TOKEN)
        assert all(code == 200 for code in allowed["codes"].values()), allowed["codes"]
        assert "unpublished_sample" in allowed["bodies"]["/"]
        assert allowed["bodies"][f"/files/{run.id}/product"].endswith("secret reconstruction")

        wrong = from_namespace(ns, base, ["/api/runs", f"/files/{run.id}/product"],
                               token="not-the-token-0123456789")
        assert set(wrong["codes"].values()) == {401}

        # A failed login is logged with the client's address: the one in the namespace.
        lines = Lines()
        logging.getLogger("beamflow.status").addHandler(lines)
        try:
            subprocess.run([IP, "netns", "exec", ns, sys.executable, "-c",
                            "import urllib.request, urllib.error\n"
                            f"r = urllib.request.Request('{base}/login', data=b'token=x',"
                            " method='POST')\n"
                            "try: urllib.request.urlopen(r, timeout=10)\n"
                            "except urllib.error.HTTPError as e: assert e.code == 401"],
                           check=True, capture_output=True, timeout=60)
        finally:
            logging.getLogger("beamflow.status").removeHandler(lines)
        assert lines.lines == [f"status: failed login from {client}"]


def test_public_viewing_is_the_explicit_opt_in(link, store) -> None:
    ns, server, client = link
    store, run = store
    app = create_app(store, StatusOptions(host=server, token=TOKEN, public_viewing=True))
    with serve_in_thread(app, server) as base:
        viewed = from_namespace(ns, base, paths_of(run))
        assert all(code == 200 for code in viewed["codes"].values()), viewed["codes"]
        assert "unpublished_sample" in viewed["bodies"]["/"]
        retry = subprocess.run(
            [IP, "netns", "exec", ns, sys.executable, "-c",
             "import urllib.request, urllib.error\n"
             f"r = urllib.request.Request('{base}/api/runs/{run.id}/retry', method='POST')\n"
             "try: urllib.request.urlopen(r, timeout=10); print(200)\n"
             "except urllib.error.HTTPError as e: print(e.code)"],
            capture_output=True, text=True, timeout=60)
        assert retry.stdout.strip() == "401"  # actions still need the token
