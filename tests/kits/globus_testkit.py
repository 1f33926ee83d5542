"""Helpers for the Globus tests (tests/test_globus*.py): configuration, stored tokens, and
recorded responses the SDK does not ship. Every request a test makes must be registered
with ``responses``: an unmatched one raises ConnectionError inside the SDK."""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from pathlib import Path
from typing import Any

from globus_sdk.testing import RegisteredResponse
from globus_sdk.token_storage import SQLiteTokenStorage, TokenStorageData

from beamflow.config import Settings, load_config
from beamflow.globus.auth import NetworkPolicy, scope_requirements

CLIENT_ID = "6a3e1e4c-3b55-4a5e-9d0f-8f1f4b8c2a11"
BEAMLINE = "1c6f33a0-8f0e-4a7d-9a55-3b1e0d8c4b21"
HPC = "2d7a44b1-9e1f-4b8e-8b66-4c2f1e9d5c32"
ENDPOINT = "3e8b55c2-af20-4c9f-9c77-5d3a2fae6d43"
IDENTITY = "8ca28797-3541-4a5d-a264-05b00f91e608"

# No retries and no back-off: a test that forgot to register a call fails at once.
NO_RETRY = NetworkPolicy(max_retries=0, max_sleep=0, http_timeout=5)


def write_config(directory: Path) -> Path:
    """A complete Globus beamflow.toml in ``directory``; returns its path."""
    path = directory / "beamflow.toml"
    path.write_text(
        f"""\
backend = "globus"
state_dir = "state"
[globus]
client_id = "{CLIENT_ID}"
[beamline]
collection_id = "{BEAMLINE}"
collection_root = "beamline"
[hpc]
collection_id = "{HPC}"
collection_root = "hpc"
[compute]
endpoint_id = "{ENDPOINT}"
"""
    )
    return path


def globus_workspace(directory: Path, monkeypatch: Any) -> Path:
    """``directory`` as the working directory, holding a complete Globus beamflow.toml, with
    no BEAMFLOW_* variable in effect (for tests of the commands)."""
    monkeypatch.chdir(directory)
    for key in list(os.environ):
        if key.startswith("BEAMFLOW_"):
            monkeypatch.delenv(key)
    write_config(directory)
    return directory


def make_settings(directory: Path) -> Settings:
    return load_config(write_config(directory))


def store_tokens(
    settings: Settings,
    *,
    flow_ids: tuple[str, ...] = (),
    refresh: bool = True,
    expires_in: float = 3600,
    identity_id: str | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Put tokens for every required resource server into the token file, as a login
    would have (resource servers in ``skip`` are left out)."""
    storage = SQLiteTokenStorage(settings.token_path)
    try:
        data = {}
        for rs, scopes in scope_requirements(settings, flow_ids).items():
            if rs in skip:
                continue
            scope = " ".join(sorted({s.scope_string for s in scopes}))
            data[rs] = TokenStorageData(
                resource_server=rs,
                identity_id=identity_id,
                scope=scope,
                access_token=f"access-{rs}",
                refresh_token=f"refresh-{rs}" if refresh else None,
                expires_at_seconds=int(time.time() + expires_in),
                token_type="Bearer",
            )
        storage.store_token_data_by_resource_server(data)
    finally:
        storage.close()


def register(
    service: str, path: str, json: Any, *, method: str = "GET", status: int = 200, **kw: Any
) -> RegisteredResponse:
    """Register one response with ``responses`` (for calls the SDK ships no fixture for)."""
    return RegisteredResponse(
        service=service, path=path, method=method, json=json, status=status, **kw
    ).add()


def userinfo(username: str = "ada@anl.gov") -> RegisteredResponse:
    return register(
        "auth",
        "/v2/oauth2/userinfo",
        {
            "sub": IDENTITY,
            "preferred_username": username,
            "name": "Ada Lovelace",
            "email": "ada@example.org",
            "identity_set": [{"sub": IDENTITY, "username": username}],
        },
    )


def transfer_task(task_id: str, status: str = "ACTIVE", **fields: Any) -> RegisteredResponse:
    """Transfer's GET /task/{id}: globus-sdk ships no recorded response for it."""
    doc = {
        "DATA_TYPE": "task",
        "task_id": task_id,
        "type": "TRANSFER",
        "status": status,
        "nice_status": "OK" if status != "FAILED" else "PERMISSION_DENIED",
        "label": "beamflow scan to HPC",
        "files": 12,
        "files_transferred": 5,
        "files_skipped": 0,
        "bytes_transferred": 5 * 2**30,
        "faults": 0,
        "subtasks_failed": 0,
        "request_time": "2026-01-05T10:00:00+00:00",
        "completion_time": None,
        **fields,
    }
    return register("transfer", f"/v0.10/task/{task_id}", doc)


# -- Globus Auth as a confidential client sees it: id_tokens, grants, consents ----------------
JWKS_URI = "https://auth.globus.org/jwk.json"


class AuthKeys:
    """A signing key standing in for Globus Auth's: the SDK fetches the OpenID configuration
    and the JWK (both registered here) and verifies each id_token's signature with it, as it
    does against Auth itself."""

    def __init__(self) -> None:
        import jwt
        from cryptography.hazmat.primitives.asymmetric import rsa

        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
        register("auth", "/.well-known/openid-configuration", {
            "issuer": "https://auth.globus.org",
            "jwks_uri": JWKS_URI,
            "id_token_signing_alg_values_supported": ["RS512"],
        })  # fmt: skip
        RegisteredResponse(service="auth", path="/jwk.json", json={"keys": [jwk]}).add()

    def id_token(self, sub: str, audience: str = CLIENT_ID) -> str:
        import jwt

        now = int(time.time())
        claims = {"sub": sub, "aud": audience, "iss": "https://auth.globus.org",
                  "iat": now, "exp": now + 3600}  # fmt: skip
        return jwt.encode(claims, self._key, algorithm="RS512")


def client_grant(keys: AuthKeys, requirements: dict[str, list[Any]],
                 client_id: str = CLIENT_ID) -> None:
    """Auth's answer to every client-credentials grant: a token for each resource server
    whose scope was asked (one, when an authorizer renews its own), and, when ``openid``
    was asked, the id_token of the client's own identity (its identity id is its client
    id)."""
    import responses
    from globus_sdk.scopes import ScopeParser

    server_of = {s.scope_string: rs for rs, scopes in requirements.items() for s in scopes}
    server_of["openid"] = "auth.globus.org"

    def answer(request: Any) -> tuple[int, dict[str, str], str]:
        asked = urllib.parse.parse_qs(request.body)["scope"][0]
        by_server: dict[str, set[str]] = {}
        for scope in ScopeParser.parse(asked):
            rs = server_of[scope.scope_string]
            by_server.setdefault(rs, set()).add(scope.scope_string)
        tokens = [{"resource_server": rs, "access_token": f"cc-{rs}", "expires_in": 172800,
                   "token_type": "Bearer", "scope": " ".join(sorted(scopes))}
                  for rs, scopes in sorted(by_server.items(),
                                           key=lambda item: item[0] != "auth.globus.org")]
        first = tokens[0]  # Auth's own token on top, with the id_token when openid was asked
        if "openid" in first["scope"].split():
            first["id_token"] = keys.id_token(client_id, client_id)
        return 200, {}, json.dumps({**first, "other_tokens": tokens[1:]})

    responses.add_callback(responses.POST, "https://auth.globus.org/v2/oauth2/token",
                           callback=answer, content_type="application/json")


def consents(identity: str, scopes: list[Any], client: str = CLIENT_ID) -> RegisteredResponse:
    """Auth's consents of ``identity``: one tree per scope in ``scopes`` (each with its
    dependencies), as GET /v2/api/identities/{id}/consents lists them."""
    records: list[dict[str, Any]] = []

    def add(scope: Any, path: list[int]) -> None:
        consent_id = 1000 + len(records)
        here = [*path, consent_id]
        records.append({
            "id": consent_id, "status": "approved", "allows_refresh": True,
            "dependency_path": here, "scope_name": scope.scope_string,
            "effective_identity": identity, "auto_approved": True,
            "atomically_revocable": False, "scope": f"scope-{consent_id}", "client": client,
            "created": "2026-01-05T10:00:00+00:00", "updated": "2026-01-05T10:00:00+00:00",
            "last_used": "2026-01-05T10:00:00+00:00",
        })  # fmt: skip
        for dep in scope.dependencies:
            add(dep, here)

    for scope in scopes:
        add(scope, [])
    return register("auth", f"/v2/api/identities/{identity}/consents", {"consents": records})
