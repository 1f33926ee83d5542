"""Which local account a Globus identity runs as on a multi-user Compute endpoint.

The endpoint maps the identities of whoever sends a task through its identity mapping file
(Globus Connect Server's format, read by ``globus_identity_mapping``); an identity no rule
covers is refused. The unattended agent's identity is its confidential client's,
``<client id>@clients.auth.globus.org``, which a rule for people (``(.*)@facility\\.org``)
does not cover. This module asks the endpoint's own mapper, so what it says is what the
endpoint will do.
"""

from __future__ import annotations

import json
from pathlib import Path

CLIENT_DOMAIN = "clients.auth.globus.org"


class MappingError(ValueError):
    """The mapping file cannot be read or is not a valid identity mapping; says which."""


def client_identity(client_id: str) -> str:
    """The Globus username of a confidential client (what the agent acts as)."""
    return f"{client_id}@{CLIENT_DOMAIN}"


def mapped_accounts(path: Path, username: str, identity_id: str) -> list[str]:
    """The local accounts the mapping at ``path`` gives the identity, in the endpoint's order
    of preference (the first that exists on the login node is used); [] when no rule covers
    it. Raises :class:`MappingError` for a file the endpoint could not load either."""
    from globus_compute_endpoint.endpoint.identity_mapper import PosixIdentityMapper

    try:
        json.loads(Path(path).read_text())  # the endpoint's own message for JSON is obscure
    except OSError as exc:
        raise MappingError(f"{path}: cannot read the identity mapping: {exc.strerror}") from None
    except ValueError as exc:
        raise MappingError(f"{path}: not valid JSON: {exc}") from None
    try:
        mapper = PosixIdentityMapper(path, "beamflow-doctor")
    except Exception as exc:  # noqa: BLE001 - globus_identity_mapping raises several kinds
        raise MappingError(f"{path}: not a valid identity mapping: {exc}") from None
    if not mapper.identity_mappings:  # unknown DATA_TYPEs are only logged by the loader
        mapper.stop_watching()
        raise MappingError(
            f"{path}: holds no identity mapping the endpoint understands (expected a list "
            'of {"DATA_TYPE": "expression_identity_mapping#1.0.0", "mappings": [...]})'
        )
    try:
        identity = {"id": identity_id, "username": username, "status": "used"}
        found: list[str] = []
        for per_mapper in mapper.map_identities([identity]):
            for mapping in per_mapper:
                found += [a for a in mapping.get(identity_id, []) if a not in found]
        return found
    finally:
        mapper.stop_watching()


def client_rule(client_id: str, account: str) -> dict[str, str]:
    """The rule that maps the client identity to ``account`` (for the fix in messages)."""
    return {
        "source": "{username}",
        "match": client_identity(client_id).replace(".", "\\."),
        "output": account,
    }
