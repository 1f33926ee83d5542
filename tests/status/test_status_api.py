"""Status page and JSON API: listing, filters, files, escaping, headers, tokens, retry."""

from __future__ import annotations

import http.client
import os
import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from page_kit import LOOPBACK, TOKEN, write_png
from pydantic import ValidationError
from typer.testing import CliRunner

from beamflow.cli import app as cli_app
from beamflow.config import Settings
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.security import COOKIE
from beamflow.status.server import StatusConfigError, options_for, serve_in_thread
from beamflow.status.views import format_duration, preview_kind

XSS_SCAN = "<script>alert(1)</script>"
XSS_ERROR = '<img src=x onerror="alert(2)"> & more'


@pytest.fixture
def previews(tmp_path: Path) -> Path:
    d = tmp_path / "beamline" / "previews" / "scan_done"
    for name in ("object_phase.png", "object_amplitude.png", "probe.png", "convergence.png"):
        write_png(d / name)
    (d / "product.h5").write_bytes(b"\x89HDF\r\n\x1a\nnot really")
    return d


def make_run(store: Store, scan: str, status: RunStatus = RunStatus.QUEUED, **fields) -> Run:
    run = store.create_run(scan_name=scan, scan_path=f"/data/{scan}",
                           flow="ptycho_reconstruct", backend="local", status=status)
    return store.update_run(run.id, **fields) if fields else run


def client_for(store: Store, retry=None, **options) -> TestClient:
    base = options.pop("base_url", LOOPBACK)
    return TestClient(create_app(store, StatusOptions(**options), retry=retry), base_url=base)


@pytest.fixture
def client(store: Store) -> TestClient:
    return client_for(store)


class FakeRetry:
    """Stands in for beamflow.runs.lifecycle.retry_run: records calls, makes the new run in the
    store."""

    def __init__(self, store: Store, error: Exception | None = None) -> None:
        self.store = store
        self.calls: list[str] = []
        self.error = error

    def __call__(self, run_id: str) -> Run:
        self.calls.append(run_id)
        if self.error is not None:
            raise self.error
        old = self.store.require_run(run_id)
        return self.store.add_retry(old, old.new_attempt(old.backend))


# -- listing, filters, pagination ----------------------------------------------------------
def test_runs_newest_first_with_total_and_pagination(store: Store, client: TestClient) -> None:
    ids = [make_run(store, f"scan_{i:03d}").id for i in range(7)]
    page = client.get("/api/runs", params={"limit": 3}).json()
    assert page["total"] == 7
    assert [r["id"] for r in page["runs"]] == ids[::-1][:3]
    second = client.get("/api/runs", params={"limit": 3, "offset": 3}).json()
    assert [r["id"] for r in second["runs"]] == ids[::-1][3:6]
    last = client.get("/api/runs", params={"limit": 3, "offset": 6}).json()
    assert [r["id"] for r in last["runs"]] == [ids[0]]
    html = client.get("/", params={"limit": 3, "offset": 3}).text
    assert "4–6 of 7" in html
    assert 'href="/?limit=3"' in html and 'href="/?limit=3&amp;offset=6"' in html


def test_filters_by_status_and_scan_substring(store: Store, client: TestClient) -> None:
    make_run(store, "lamellaA_001", RunStatus.SUCCEEDED)
    make_run(store, "lamellaA_002", RunStatus.FAILED, error="no positions")
    make_run(store, "siemens_star", RunStatus.FAILED, error="bad file")
    make_run(store, "lamellaB_001", RunStatus.ACTIVE)

    failed = client.get("/api/runs", params={"status": "failed"}).json()
    assert failed["total"] == 2 and {r["scan_name"] for r in failed["runs"]} == {
        "lamellaA_002", "siemens_star"}
    both = client.get("/api/runs", params={"status": "FAILED", "scan": "lamella"}).json()
    assert [r["scan_name"] for r in both["runs"]] == ["lamellaA_002"]
    several = client.get("/api/runs", params={"status": "ACTIVE,SUCCEEDED"}).json()
    assert {r["scan_name"] for r in several["runs"]} == {"lamellaA_001", "lamellaB_001"}
    # counts per status follow the scan filter, so the chips say what the filter holds
    assert client.get("/api/runs", params={"scan": "lamellaA"}).json()["counts"]["FAILED"] == 1
    # LIKE wildcards in the scan filter are literal
    assert client.get("/api/runs", params={"scan": "%"}).json()["total"] == 0

    html = client.get("/", params={"status": "FAILED", "scan": "star"}).text
    assert "siemens_star" in html and "lamellaA_002" not in html
    assert '<option value="FAILED" selected>' in html


def test_bad_filters_are_refused_with_a_reason(client: TestClient) -> None:
    r = client.get("/api/runs", params={"status": "EXPLODED"})
    assert r.status_code == 400 and "EXPLODED" in r.json()["detail"]
    assert client.get("/api/runs", params={"limit": 0}).status_code == 422
    assert client.get("/api/runs", params={"limit": 100000}).status_code == 422
    assert client.get("/api/runs", params={"offset": -1}).status_code == 422


def test_progress_step_and_duration_are_shown(store: Store, client: TestClient) -> None:
    run = make_run(store, "scan_live", RunStatus.ACTIVE, iterations_total=200, iteration=50,
                   current_step="Reconstruct")
    data = client.get("/api/runs").json()["runs"][0]
    assert data["progress"] == pytest.approx(0.25)
    assert data["progress_text"] == "iteration 50 of 200"
    assert data["current_step"] == "Reconstruct" and data["status_label"] == "Running"
    html = client.get("/").text
    assert 'value="0.25"' in html and "iteration 50 of 200" in html
    assert f'href="/runs/{run.id}"' in html


def test_api_sees_writes_from_another_store_instance(store: Store, tmp_path: Path) -> None:
    # The agent writes the store from another process; each request must read fresh data.
    client = client_for(store)
    run = make_run(store, "scan_flip", RunStatus.ACTIVE)
    assert client.get(f"/api/runs/{run.id}").json()["run"]["status"] == "ACTIVE"
    writer = Store(store.path)
    writer.update_run(run.id, status=RunStatus.SUCCEEDED)
    assert client.get(f"/api/runs/{run.id}").json()["run"]["status"] == "SUCCEEDED"
    assert client.get("/api/runs", params={"status": "SUCCEEDED"}).json()["total"] == 1


# -- run detail ------------------------------------------------------------------------------
def test_run_detail_has_steps_error_previews_product(
    store: Store, client: TestClient, previews: Path
) -> None:
    run = make_run(
        store, "scan_done", RunStatus.FAILED, error="reconstruction diverged (NaN in object)",
        error_step="Reconstruct", product=str(previews / "product.h5"),
        parameters={"algorithm": "rpie", "iterations": 100},
    )
    store.add_previews(run.id, [str(previews / n) for n in (
        "convergence.png", "probe.png", "object_amplitude.png", "object_phase.png")])
    t0 = time.time() - 30
    store.record_step(run.id, "TransferIn", "SUCCEEDED", started_at=t0, finished_at=t0 + 4)
    store.record_step(run.id, "Reconstruct", "FAILED", started_at=t0 + 4, finished_at=t0 + 24)
    store.add_event(run.id, "failed", "Reconstruct failed", level="error")

    d = client.get(f"/api/runs/{run.id}").json()
    assert [s["name"] for s in d["steps"]] == ["TransferIn", "Reconstruct"]
    assert d["steps"][0]["duration"] == pytest.approx(4) and d["steps"][0]["left"] == 0
    # Finished steps are full bars, whatever they took: the text gives the duration.
    assert [(s["width"], s["duration_text"]) for s in d["steps"]] == [
        (100.0, "4.0 s"), (100.0, "20.0 s")]
    assert [s["label"] for s in d["steps"]] == ["Transfer in", "Reconstruct"]
    assert [p["label"] for p in d["previews"]] == [
        "Object phase", "Object amplitude", "Probe", "Convergence"]
    assert all(p["exists"] and p["url"].startswith(f"/files/{run.id}/") for p in d["previews"])
    assert d["product_url"] == f"/files/{run.id}/product"
    assert d["events"][0]["message"] == "Reconstruct failed"
    assert d["run"]["error_step"] == "Reconstruct" and d["parameters"]["algorithm"] == "rpie"

    html = client.get(f"/runs/{run.id}").text
    assert "reconstruction diverged (NaN in object)" in html and "in step Reconstruct" in html
    for p in d["previews"]:
        assert f'src="{p["url"]}"'.replace("&", "&amp;") in html
    assert "algorithm" in html and "rpie" in html and "product.h5" in html
    for p in d["previews"]:
        image = client.get(p["url"])
        assert image.status_code == 200 and image.headers["content-type"] == "image/png"
        assert image.content.startswith(b"\x89PNG")


def test_preview_url_changes_when_a_progressive_run_rewrites_it(
    store: Store, client: TestClient, previews: Path
) -> None:
    run = make_run(store, "scan_prog", RunStatus.ACTIVE)
    phase = previews / "object_phase.png"
    store.add_previews(run.id, [str(phase)])
    first = client.get(f"/api/runs/{run.id}").json()["previews"][0]["url"]
    write_png(phase, shade=200)
    later = time.time() + 5
    os.utime(phase, (later, later))
    second = client.get(f"/api/runs/{run.id}").json()["previews"][0]["url"]
    assert first != second and second.split("?")[0] == first.split("?")[0]

    # A later stage that writes a new file of the same kind replaces the shown one.
    newer = write_png(previews / "stage2" / "object_phase.png")
    store.add_previews(run.id, [str(newer)])
    shown = client.get(f"/api/runs/{run.id}").json()["previews"]
    assert len(shown) == 1 and shown[0]["index"] == 1


def test_full_range_phase_is_offered_on_the_phase_figure(
    store: Store, client: TestClient, previews: Path
) -> None:
    """object_phase_full.png is no fifth figure: the phase figure links to it ("full
    range"); listed without a windowed phase, it is shown as a figure of its own."""
    full = write_png(previews / "object_phase_full.png", shade=60)
    run = make_run(store, "scan_full", RunStatus.SUCCEEDED)
    store.add_previews(run.id, [str(previews / n) for n in (
        "object_phase.png", "object_phase_full.png", "object_amplitude.png", "probe.png",
        "convergence.png")])
    d = client.get(f"/api/runs/{run.id}").json()
    assert [p["kind"] for p in d["previews"]] == [
        "object_phase", "object_amplitude", "probe", "convergence"]
    link = d["previews"][0]["full_range_url"]
    assert link.startswith(f"/files/{run.id}/1?v=")
    assert client.get(link).content == full.read_bytes()
    assert all(p["full_range_url"] is None for p in d["previews"][1:])
    html = client.get(f"/runs/{run.id}").text
    assert f'<a class="full-range" href="{link}"' in html and ">full range</a>" in html

    alone = make_run(store, "scan_full_only", RunStatus.ACTIVE)
    store.add_previews(alone.id, [str(full)])
    (only,) = client.get(f"/api/runs/{alone.id}").json()["previews"]
    assert only["kind"] == "object_phase_full" and only["label"] == "Object phase, full range"
    assert 'class="full-range"' not in client.get(f"/runs/{alone.id}").text


def test_unknown_run_is_404_page_and_json(client: TestClient) -> None:
    assert client.get("/api/runs/nope").status_code == 404
    page = client.get("/runs/nope")
    assert page.status_code == 404 and "no run" in page.text and "<html" in page.text


def test_healthz_reports_store_and_counts(store: Store, client: TestClient) -> None:
    make_run(store, "a", RunStatus.FAILED)
    make_run(store, "b", RunStatus.SUCCEEDED)
    h = client.get("/healthz").json()
    assert h["ok"] is True and h["runs"] == 2 and h["counts"]["FAILED"] == 1


# -- files: only what the store lists -------------------------------------------------------------
def test_files_by_index_name_and_product(
    store: Store, client: TestClient, previews: Path
) -> None:
    run = make_run(store, "scan_f", RunStatus.SUCCEEDED, product=str(previews / "product.h5"))
    store.add_previews(run.id, [str(previews / "object_phase.png"), str(previews / "probe.png")])
    assert client.get(f"/files/{run.id}/1").content == (previews / "probe.png").read_bytes()
    assert client.get(f"/files/{run.id}/object_phase.png").status_code == 200
    product = client.get(f"/files/{run.id}/product")
    assert product.status_code == 200
    assert product.headers["content-type"] == "application/octet-stream"
    assert "attachment" in product.headers["content-disposition"]
    assert client.get(f"/files/{run.id}/2").status_code == 404
    assert client.get(f"/files/{run.id}/convergence.png").status_code == 404  # exists, unlisted
    other = make_run(store, "other")
    assert client.get(f"/files/{other.id}/product").status_code == 404
    assert client.get(f"/files/{other.id}/0").status_code == 404


def test_listed_files_must_exist_and_be_regular(
    store: Store, client: TestClient, tmp_path: Path
) -> None:
    listed_dir = tmp_path / "a_directory.png"
    listed_dir.mkdir()
    svg = tmp_path / "drawing.svg"
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
    run = make_run(store, "scan_odd")
    store.add_previews(run.id, [str(tmp_path / "gone.png"), str(listed_dir), str(svg)])
    assert client.get(f"/files/{run.id}/0").status_code == 404
    assert client.get(f"/files/{run.id}/1").status_code == 404
    # Not an image type: never rendered inline by the browser.
    served = client.get(f"/files/{run.id}/2")
    assert served.headers["content-type"] == "application/octet-stream"
    assert served.headers["content-disposition"].startswith("attachment")
    detail = client.get(f"/api/runs/{run.id}").json()["previews"]
    assert [p["exists"] for p in detail] == [False, False, True]


TRAVERSALS = [
    "/files/{id}/../../etc/passwd",
    "/files/{id}/..%2f..%2f..%2fetc%2fpasswd",
    "/files/{id}/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/files/{id}/%2Fetc%2Fpasswd",
    "/files/{id}/passwd",
    "/files/{id}/..%5c..%5cetc%5cpasswd",
    "/files/../../../../etc/passwd",
    "/files/%2e%2e/%2e%2e/etc/passwd",
    "/files/{id}/-1",
    "/files/{id}/0%00.png",
    "/static/../../../../etc/passwd",
    "/static/..%2f..%2f..%2f..%2fetc%2fpasswd",
]


def test_traversal_attempts_never_reach_other_files(
    store: Store, previews: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0 TOP SECRET")
    run = make_run(store, "scan_t", RunStatus.SUCCEEDED)
    store.add_previews(run.id, [str(previews / "probe.png")])
    app = create_app(store, StatusOptions())
    # A real server and http.client: the raw path goes out exactly as written (httpx would
    # remove the dot segments before sending).
    with serve_in_thread(app) as base:
        host, port = base.removeprefix("http://").split(":")
        for template in TRAVERSALS + [f"/files/{run.id}/{secret}", f"/files/{run.id}/{secret}"
                                      .replace("/", "%2f")]:
            path = template.replace("{id}", run.id)
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            assert resp.status in (400, 404), (path, resp.status)
            assert b"root:" not in body and b"SECRET" not in body, path


# -- escaping and headers ------------------------------------------------------------------------
def test_scan_names_and_errors_are_escaped(store: Store, client: TestClient) -> None:
    run = make_run(store, XSS_SCAN, RunStatus.FAILED, error=XSS_ERROR, error_step="<b>step</b>")
    store.add_event(run.id, "x", "<script>alert(3)</script>")
    for page in (client.get("/").text, client.get(f"/runs/{run.id}").text):
        assert XSS_SCAN not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "<img src=x" not in page
        assert "<b>step</b>" not in page
    assert "&lt;img src=x onerror=&#34;alert(2)&#34;&gt; &amp; more" in client.get(
        f"/runs/{run.id}").text
    assert "<script>alert(3)" not in client.get(f"/runs/{run.id}").text
    # The API returns the raw text (JSON is data); the page script only uses textContent.
    assert client.get(f"/api/runs/{run.id}").json()["run"]["scan_name"] == XSS_SCAN
    script = client.get("/static/status.js").text
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


def test_security_headers_on_every_kind_of_response(
    store: Store, client: TestClient, previews: Path
) -> None:
    run = make_run(store, "s", RunStatus.SUCCEEDED)
    store.add_previews(run.id, [str(previews / "probe.png")])
    for url in ("/", f"/runs/{run.id}", "/api/runs", f"/api/runs/{run.id}", "/healthz",
                f"/files/{run.id}/0", "/static/status.css", "/runs/missing", "/nowhere"):
        headers = client.get(url).headers
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp and "unsafe-inline" not in csp, url
        assert "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "same-origin"


def test_pages_have_no_inline_script_or_style_and_no_external_assets(
    store: Store, client: TestClient
) -> None:
    run = make_run(store, "s", RunStatus.FAILED, error="x")
    for url in ("/", f"/runs/{run.id}", "/runs/missing"):
        html = client.get(url).text
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == [], url
        assert "<style" not in html and " style=" not in html and " on" + "click=" not in html
        assert re.findall(r"""(?:src|href)=["'](?:https?:)?//""", html) == [], url
    for asset in ("status.css", "status.js", "icons.svg"):
        body = client.get(f"/static/{asset}").text
        assert "http://" not in body.replace("http://www.w3.org", "") and "https://" not in body
        assert "@import" not in body


def test_swagger_ui_is_off_because_it_needs_a_cdn(client: TestClient) -> None:
    assert client.get("/docs").status_code == 404
    assert client.get("/api/openapi.json").status_code == 200


# -- who may view and act ----------------------------------------------------------------
def test_loopback_refuses_foreign_host_headers(store: Store) -> None:
    # DNS rebinding: evil.example resolving to 127.0.0.1 must not read or act.
    evil = client_for(store, base_url="http://evil.example:8765")
    assert evil.get("/api/runs").status_code == 421
    assert client_for(store, base_url="http://localhost:8765").get("/healthz").status_code == 200
    assert client_for(store, base_url="http://[::1]:8765").get("/healthz").status_code == 200


def test_loopback_retry_needs_csrf_but_no_token(store: Store) -> None:
    failed = make_run(store, "scan_bad", RunStatus.FAILED, error="boom")
    retry = FakeRetry(store)
    client = client_for(store, retry=retry)
    page = client.get(f"/runs/{failed.id}").text
    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page).group(1)

    assert client.post(f"/api/runs/{failed.id}/retry").status_code == 403
    assert client.post(f"/api/runs/{failed.id}/retry",
                       headers={"X-CSRF-Token": "0" * 64}).status_code == 403
    cross = client.post(f"/api/runs/{failed.id}/retry", headers={
        "X-CSRF-Token": csrf, "Origin": "http://evil.example"})
    assert cross.status_code == 403
    site = client.post(f"/api/runs/{failed.id}/retry", headers={
        "X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"})
    assert site.status_code == 403
    assert retry.calls == []

    ok = client.post(f"/api/runs/{failed.id}/retry", headers={
        "X-CSRF-Token": csrf, "Origin": LOOPBACK, "Sec-Fetch-Site": "same-origin"})
    assert ok.status_code == 200, ok.text
    new = store.get_run(ok.json()["id"])
    assert new is not None and new.parent_run_id == failed.id and retry.calls == [failed.id]

    # The no-script form posts the token as a field and is sent on to the new run.
    other = make_run(store, "scan_other", RunStatus.FAILED)
    form = client.post(f"/api/runs/{other.id}/retry", data={"csrf": csrf},
                       follow_redirects=False)
    assert form.status_code == 303 and form.headers["location"].startswith("/runs/")


def test_retry_validation(store: Store) -> None:
    done = make_run(store, "scan_ok", RunStatus.SUCCEEDED)
    failed = make_run(store, "scan_bad", RunStatus.FAILED)
    client = client_for(store, retry=FakeRetry(store), token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post(f"/api/runs/{done.id}/retry", headers=auth).status_code == 409
    assert client.post("/api/runs/missing/retry", headers=auth).status_code == 404

    assert client_for(store).post(f"/api/runs/{failed.id}/retry", headers=auth).status_code == 403
    no_retry = client_for(store, token=TOKEN)
    assert no_retry.post(f"/api/runs/{failed.id}/retry", headers=auth).status_code == 501
    refused = client_for(store, retry=FakeRetry(store, ValueError("scan file is gone")),
                         token=TOKEN)
    r = refused.post(f"/api/runs/{failed.id}/retry", headers=auth)
    assert r.status_code == 409 and "scan file is gone" in r.json()["detail"]
    broken = client_for(store, retry=FakeRetry(store, RuntimeError("flows service down")),
                        token=TOKEN)
    r = broken.post(f"/api/runs/{failed.id}/retry", headers=auth)
    assert r.status_code == 502 and "flows service down" in r.json()["detail"]


def test_retry_goes_through_the_shared_run_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `beamflow serve` wires: beamflow.run_backends.retry_and_follow with the
    # configuration. The scan file is gone, so the new attempt fails at once, with the reason,
    # linked to the old run.
    from functools import partial

    from beamflow.run_backends import retry_and_follow

    settings = Settings(state_dir=tmp_path / "state")
    store = Store(settings.store_path)
    missing = tmp_path / "beamline" / "detector" / "gone_master.h5"
    old = store.create_run(scan_name="gone", flow="ptycho_reconstruct", backend="local",
                           scan_path=str(missing))
    store.update_run(old.id, status=RunStatus.FAILED, error="boom", error_step="Reconstruct")
    client = client_for(store, retry=partial(retry_and_follow, settings))
    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"',
                     client.get(f"/runs/{old.id}").text).group(1)
    r = client.post(f"/api/runs/{old.id}/retry", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200, r.text
    new = client.get(f"/api/runs/{r.json()['id']}").json()["run"]
    assert new["parent_run_id"] == old.id and new["attempt"] == 2
    assert new["status"] == "FAILED" and "does not exist" in new["error"]
    assert "retry of" in client.get(f"/runs/{new['id']}").text


def test_exposed_server_needs_a_token_to_start(store: Store) -> None:
    with pytest.raises(ValueError, match="without a token"):
        create_app(store, StatusOptions(host="0.0.0.0"))
    with pytest.raises(StatusConfigError, match="BEAMFLOW_STATUS__TOKEN"):
        options_for(Settings(), host="0.0.0.0")
    with pytest.raises(StatusConfigError, match="at least 16"):
        options_for(Settings(status={"token": "short"}), host="10.1.2.3")
    # The old key: true is today's default and still loads; false (public) must be said anew.
    assert Settings(status={"require_token_for_viewing": True}).status.public_viewing is False
    with pytest.raises(ValidationError, match="status.public_viewing = true"):
        Settings(status={"require_token_for_viewing": False})
    assert options_for(Settings(status={"token": TOKEN, "public_viewing": True}),
                       host="10.1.2.3").public_viewing is True
    assert options_for(Settings(status={"token": TOKEN}), host="0.0.0.0").host == "0.0.0.0"
    assert options_for(Settings()).host == "127.0.0.1"


def test_cli_serve_refuses_to_expose_without_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "beamflow.toml").write_text("")  # a workspace: serve keeps its state here
    monkeypatch.delenv("BEAMFLOW_STATUS__TOKEN", raising=False)
    runner = CliRunner()
    result = runner.invoke(cli_app, ["serve", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "without a token" in result.output
    monkeypatch.setenv("BEAMFLOW_STATUS__TOKEN", "abc")
    result = runner.invoke(cli_app, ["serve", "--host", "0.0.0.0"])
    assert result.exit_code == 1 and "at least 16" in result.output


@pytest.mark.parametrize(("public", "said"), [
    (False, "every page, preview, API call and download needs the status token"),
    (True, "anyone who reaches it may view runs (status.public_viewing)")])
def test_cli_serve_says_who_may_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, public: bool, said: str
) -> None:
    import socket

    monkeypatch.chdir(tmp_path)
    (tmp_path / "beamflow.toml").write_text("")  # a workspace: serve keeps its state here
    for key in [k for k in os.environ if k.startswith("BEAMFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("BEAMFLOW_STATUS__TOKEN", TOKEN)
    monkeypatch.setenv("BEAMFLOW_STATUS__PUBLIC_VIEWING", str(public).lower())
    with socket.socket() as taken:  # the server cannot bind: it says its piece and ends
        taken.bind(("0.0.0.0", 0))  # noqa: S104 - only to make the port busy
        taken.listen()
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(cli_app, ["serve", "--host", "0.0.0.0", "--port", port])
    assert said in result.stdout and result.exit_code != 0


def test_exposed_actions_need_the_token(store: Store) -> None:
    failed = make_run(store, "scan_bad", RunStatus.FAILED)
    retry = FakeRetry(store)
    exposed = "http://beamline-ws.example:8765"
    client = client_for(store, retry=retry, host="0.0.0.0", token=TOKEN, base_url=exposed,
                        public_viewing=True)
    page = client.get(f"/runs/{failed.id}")
    assert page.status_code == 200 and "Log in to retry" in page.text  # viewing is opened
    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page.text).group(1)
    assert client.post(f"/api/runs/{failed.id}/retry",
                       headers={"X-CSRF-Token": csrf}).status_code == 401
    wrong = client.post(f"/api/runs/{failed.id}/retry", headers={
        "Authorization": "Bearer nope", "X-CSRF-Token": csrf})
    assert wrong.status_code == 401
    assert retry.calls == []
    # Bearer: a header browsers never add on their own, so no CSRF token is needed.
    assert client.post(f"/api/runs/{failed.id}/retry",
                       headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200

    # The login form: a session cookie, HttpOnly and SameSite=Strict; then CSRF still applies.
    bad = client.post("/login", data={"token": "guess", "next": "/"}, follow_redirects=False)
    assert bad.status_code == 401 and COOKIE not in bad.cookies
    good = client.post("/login", data={"token": TOKEN, "next": f"/runs/{failed.id}"},
                       follow_redirects=False)
    assert good.status_code == 303 and good.headers["location"] == f"/runs/{failed.id}"
    cookie = good.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert TOKEN not in cookie
    other = make_run(store, "scan_other", RunStatus.FAILED)
    assert client.post(f"/api/runs/{other.id}/retry").status_code == 403  # cookie, no CSRF
    assert "Retry run" in client.get(f"/runs/{other.id}").text
    ok = client.post(f"/api/runs/{other.id}/retry", headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 200 and len(retry.calls) == 2


def test_login_never_redirects_off_site(store: Store) -> None:
    client = client_for(store, token=TOKEN)
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        r = client.post("/login", data={"token": TOKEN, "next": target}, follow_redirects=False)
        assert r.headers["location"] == "/", target


def test_exposed_viewing_needs_the_token_by_default(store: Store, previews: Path) -> None:
    run = make_run(store, "scan_private", RunStatus.SUCCEEDED, product=str(previews / "product.h5"))
    store.add_previews(run.id, [str(previews / "probe.png")])
    client = client_for(store, host="0.0.0.0", token=TOKEN, base_url="http://10.0.0.5:8765")
    for url in ("/", f"/runs/{run.id}", "/?scan=scan_private"):
        page = client.get(url, follow_redirects=False)
        # The login form, answered 401: curl and scripts see the refusal, people the form.
        assert page.status_code == 401 and 'action="/login"' in page.text, url
        assert "scan_private" not in page.text.replace('value="/?scan=scan_private"', ""), url
    for url in ("/api/runs", f"/api/runs/{run.id}", f"/files/{run.id}/0",
                f"/files/{run.id}/product", "/api/agent", "/api/openapi.json"):
        denied = client.get(url)
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer", url
        assert "scan_private" not in denied.text
    health = client.get("/healthz").json()
    assert health["ok"] is True and "counts" not in health and "store" not in health
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/runs", headers=auth).json()["total"] == 1
    assert client.get(f"/files/{run.id}/0", headers=auth).status_code == 200
    assert client.get(f"/files/{run.id}/product", headers=auth).status_code == 200
    assert client.get("/api/openapi.json", headers=auth).json()["info"]["title"]
    login = client.post("/login", data={"token": TOKEN, "next": f"/runs/{run.id}"},
                        follow_redirects=False)
    assert login.status_code == 303 and login.headers["location"] == f"/runs/{run.id}"
    assert "scan_private" in client.get("/").text
    assert client.get("/static/status.css").status_code == 200  # no data in static files


def test_public_viewing_is_an_explicit_opt_in(store: Store, previews: Path) -> None:
    run = make_run(store, "scan_public", RunStatus.FAILED, product=str(previews / "product.h5"))
    client = client_for(store, retry=FakeRetry(store), host="0.0.0.0", token=TOKEN,
                        public_viewing=True, base_url="http://10.0.0.5:8765")
    assert "scan_public" in client.get("/").text
    assert client.get(f"/api/runs/{run.id}").status_code == 200
    assert client.get(f"/files/{run.id}/product").status_code == 200
    # Viewing only: actions still need the token.
    assert client.post(f"/api/runs/{run.id}/retry").status_code == 401
    # On loopback nothing changes: this machine may view without a token.
    local = client_for(store, token=TOKEN)
    assert local.get("/api/runs").status_code == 200


# -- small pieces -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind"),
    [("object_phase.png", "object_phase"), ("object_phase_full.png", "object_phase_full"),
     ("scan01_obj_amp.png", "object_amplitude"),
     ("probe_phase.png", "probe"), ("convergence.png", "convergence"),
     ("loss.png", "convergence"), ("object_layers.png", "object_layers"),
     ("sample.png", "other")],
)
def test_preview_kinds(name: str, kind: str) -> None:
    assert preview_kind(name)[0] == kind


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "–"), (4.21, "4.2 s"), (192, "3 min 12 s"), (3900, "1 h 05 min")],
)
def test_durations_read_well(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text
