"""Read deploy/compute-endpoint/ the way globus-compute-endpoint 4.19 does, with its own code.

A multi-user endpoint (a config.yaml without `engine`) renders its
user_config_template.yaml.j2 for each user with the variables their submission carries,
after validating them against user_config_schema.json, and loads the result as that user's
endpoint config. `render_user_config` makes the same calls in the same order as the
endpoint's `render-user-config` command (globus_compute_endpoint.cli), which mirrors what
the running endpoint does (core_endpoint.CoreEndpoint): so what loads here loads there.
"""

from __future__ import annotations

import json
import os
import pwd
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from globus_compute_endpoint.endpoint.config import CoreEndpointConfig, UserEndpointConfig
from globus_compute_endpoint.endpoint.config.utils import (
    get_config,
    load_config_yaml,
    load_user_config_schema,
    load_user_config_template,
    render_config_user_template,
)
from globus_compute_endpoint.endpoint.endpoint import Endpoint
from globus_compute_endpoint.endpoint.identity_mapper import MappedPosixIdentity
from globus_compute_sdk.sdk.batch import create_user_runtime

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "compute-endpoint"


def core_config(endpoint_dir: Path) -> CoreEndpointConfig:
    """The multi-user endpoint's own config.yaml, through the endpoint's loader."""
    config = get_config(endpoint_dir)
    if not isinstance(config, CoreEndpointConfig):
        raise TypeError(f"{endpoint_dir / 'config.yaml'}: not a multi-user endpoint config")
    return config


def render_user_config(endpoint_dir: Path, user_opts: dict[str, Any]) -> str:
    """The YAML a user's endpoint process would get for `user_opts`; raises
    jsonschema.ValidationError when the schema refuses them."""
    parent = core_config(endpoint_dir)
    template_path = Endpoint.user_config_template_path(endpoint_dir, parent)
    schema = load_user_config_schema(Endpoint.user_config_schema_path(endpoint_dir, parent))
    # The submitting SDK's runtime (Python and SDK versions), as JSON like the endpoint
    # receives it; and this process's account standing in for the identity-mapped user.
    runtime = json.loads(json.dumps(asdict(create_user_runtime())))
    identity = MappedPosixIdentity(
        local_user_record=pwd.getpwuid(os.getuid()),
        matched_identity=uuid.UUID(int=0),
        globus_identity_candidates=[],
    )
    return render_config_user_template(
        parent_config=parent,
        user_config_template=load_user_config_template(template_path),
        user_config_template_path=template_path,
        mapped_identity=identity,
        user_config_schema=schema,
        user_opts=user_opts,
        user_runtime=runtime,
    )


def user_config(endpoint_dir: Path, user_opts: dict[str, Any]) -> UserEndpointConfig:
    """Render, then load with the endpoint's loader: the user endpoint's config, its engine
    built but not started (call `.engine.shutdown()` when done with it)."""
    config = load_config_yaml(render_user_config(endpoint_dir, user_opts))
    if not isinstance(config, UserEndpointConfig) or config.engine is None:
        raise TypeError(f"{endpoint_dir}: the rendered template has no engine")
    return config


def example(endpoint_dir: Path) -> dict[str, Any]:
    return json.loads((endpoint_dir / "example.json").read_text())
