"""Who may do what with beamflow's flows and runs on Globus Flows.

A flow can be started only by its owner and its ``flow_starters``: registered by a person
with no starters, the agent (another identity, its confidential client) could not start a
single run. So every flow is deployed with its roles from ``[globus]`` in beamflow.toml:

- ``flow_starters``: the agent's client identity (``urn:globus:auth:identity:<client id>``:
  a client's identity id is its client id), the staff group, ``globus.flow_starters``;
- ``flow_viewers``: the starters and ``globus.flow_viewers``;
- ``flow_administrators``: ``globus.flow_administrators`` (the owner always is one).

Every run beamflow starts carries ``run_managers`` (may cancel it) and ``run_monitors`` (may
see it): the staff group and ``globus.run_managers`` / ``globus.run_monitors``, so beamline
staff follow and cancel the agent's runs in the Globus web app.
"""

from __future__ import annotations

from pydantic import BaseModel

from beamflow.config import Settings, agent_client_id
from beamflow.globus.auth import client_identity_urn


def group_urn(group_id: str) -> str:
    return f"urn:globus:groups:id:{group_id}"


class FlowRoles(BaseModel):
    """The roles a flow is deployed with (Flows' create/update fields, by name)."""

    flow_starters: list[str]
    flow_viewers: list[str]
    flow_administrators: list[str]


class RunRoles(BaseModel):
    """The roles every run is started with (``run_flow``'s fields, by name)."""

    run_managers: list[str]
    run_monitors: list[str]


def _unique(*groups: list[str]) -> list[str]:
    seen: list[str] = []
    for group in groups:
        seen += [p for p in group if p not in seen]
    return seen


def flow_roles(settings: Settings) -> FlowRoles:
    g = settings.globus
    agent = agent_client_id(settings)
    agent_urn = [client_identity_urn(agent)] if agent else []
    staff = [group_urn(g.staff_group)] if g.staff_group else []
    starters = _unique(agent_urn, staff, g.flow_starters)
    return FlowRoles(
        flow_starters=starters,
        flow_viewers=_unique(starters, g.flow_viewers),
        flow_administrators=_unique(g.flow_administrators),
    )


def run_roles(settings: Settings) -> RunRoles:
    g = settings.globus
    staff = [group_urn(g.staff_group)] if g.staff_group else []
    return RunRoles(run_managers=_unique(staff, g.run_managers),
                    run_monitors=_unique(staff, g.run_monitors))  # fmt: skip
