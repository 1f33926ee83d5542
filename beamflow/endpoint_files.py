"""The Globus Compute endpoint's files for this site, written from beamflow.toml, and the
checks `beamflow doctor` makes of them: no placeholder reaches production.

`beamflow render-endpoint deploy/compute-endpoint/<kind> DIR` copies a kind's files into DIR
with the site's values in:

- ``user_config_template.yaml.j2``: its ``{%- set site_NAME = ... %}`` lines (the defaults a
  submission without variables runs with) from ``[cluster]``: ``worker_env`` (the
  environment the workers activate), ``modules`` and ``module_paths`` (``module load`` /
  ``module use``; a failed one fails the batch job, saying which), and from
  ``[cluster.final]`` the scheduler's ``partition`` or ``queue``, ``account``, ``walltime``,
  ``gpus_per_node``;
- ``identity_mapping.json`` (clusters): the agent's client identity
  (``<client id>@clients.auth.globus.org``; the client is ``globus.agent_client_id``, else
  this configuration's own client) runs as ``cluster.service_account``; people
  ``<user>@<cluster.people_domain>`` as themselves when the domain is set.

What it cannot fill in it refuses to write, naming the key to set. The doctor reads the
copy named by ``cluster.endpoint_dir`` and fails on a placeholder left (``FILL``,
``BEAMLINE-CLIENT-ID``, ``facility.org``), on a module command whose failure is hidden
(``|| true``, ``2>/dev/null``), and on a worker environment the mapped account cannot reach.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beamflow.config import Settings, agent_client_id

TEMPLATE = "user_config_template.yaml.j2"
MAPPING = "identity_mapping.json"
CLIENT_DOMAIN = "clients.auth.globus.org"
PLACEHOLDERS = ("FILL", "BEAMLINE-CLIENT-ID", "facility.org", "facility\\\\.org")

_SITE_LINE = re.compile(r"^\{%- set (site_[a-z_]+) = (.*) %\}$", re.MULTILINE)
# A module command whose failure the line hides: the job goes on without the module.
_HIDDEN_FAILURE = re.compile(r"^\s*module\s.*(\|\|\s*true|2>\s*/dev/null)")
_SOURCE = re.compile(r"source\s+(\S+?)/bin/activate")


class RenderError(ValueError):
    """The files cannot be written as asked; the message names the key or file to fix."""


@dataclass(frozen=True)
class Rendered:
    written: list[Path]
    configure: list[tuple[str, str]]  # (for whom, the globus-compute-endpoint command)


def _quoted(value: str) -> str:
    """A string default as the endpoint hands a submission's strings: JSON-quoted."""
    return "'" + json.dumps(value) + "'"


# The template's site lines beamflow.toml writes: site_NAME -> its key.
SITE_KEYS = {
    "site_beamflow_env": "cluster.worker_env",
    "site_modules": "cluster.modules",
    "site_module_paths": "cluster.module_paths",
    "site_partition": "cluster.final.partition",
    "site_queue": "cluster.final.queue",
    "site_account": "cluster.final.account",
    "site_walltime": "cluster.final.walltime",
    "site_gpus_per_node": "cluster.final.gpus_per_node",
}


def site_values(settings: Settings) -> dict[str, str]:
    """``site_NAME`` -> its Jinja literal, for what beamflow.toml sets."""
    c, final = settings.cluster, settings.cluster.final
    values = {"site_modules": json.dumps(c.modules),
              "site_module_paths": json.dumps(c.module_paths)}  # fmt: skip
    if c.worker_env:
        values["site_beamflow_env"] = _quoted(c.worker_env)
    for name in ("partition", "queue", "account", "walltime"):
        value = getattr(final, name)
        if value is not None:
            values[f"site_{name}"] = _quoted(value)
    if final.gpus_per_node is not None:
        values["site_gpus_per_node"] = str(final.gpus_per_node)
    return values


def render_template(text: str, settings: Settings, where: str) -> str:
    """The template with this site's ``site_`` lines."""
    present = dict(_SITE_LINE.findall(text))
    if not present:
        raise RenderError(f"{where}: no `{{%- set site_... %}}` lines: not a beamflow template")
    values = site_values(settings)
    takes = sorted(key for name, key in SITE_KEYS.items() if name in present)
    for name in values:
        if name not in present:
            raise RenderError(f"{SITE_KEYS[name]} is set, but {where} has no such setting (of "
                              f"beamflow.toml it takes {', '.join(takes)}); unset it")
    rendered = _SITE_LINE.sub(
        lambda m: f"{{%- set {m[1]} = {values.get(m[1], m[2])} %}}", text)
    left = [name for name, literal in _SITE_LINE.findall(rendered) if "FILL" in literal]
    if left:
        raise RenderError(f"{where}: no value for {', '.join(left)}: set "
                          f"{', '.join(SITE_KEYS.get(n, n) for n in left)} in beamflow.toml")
    return rendered


def identity_mapping(settings: Settings) -> list[dict[str, Any]]:
    """The endpoint's identity mapping for this site (Globus Connect Server's format)."""
    client = agent_client_id(settings)
    account = settings.cluster.service_account
    missing = [key for key, value in (("globus.agent_client_id", client),
                                      ("cluster.service_account", account)) if not value]
    if missing:
        raise RenderError(f"the identity mapping needs {' and '.join(missing)} in beamflow.toml "
                          "(the agent's client runs as the service account)")  # fmt: skip
    rules: list[dict[str, Any]] = [{
        "source": "{username}",
        "match": f"{client}@{CLIENT_DOMAIN}".replace(".", "\\."),
        "output": account,
        "ignore_case": True,
    }]  # fmt: skip
    if settings.cluster.people_domain:
        rules.append({"source": "{username}",
                      "match": f"(.*)@{re.escape(settings.cluster.people_domain)}",
                      "output": "{0}"})  # fmt: skip
    return [{"DATA_TYPE": "expression_identity_mapping#1.0.0", "mappings": rules}]


def render_endpoint(settings: Settings, source: Path, out: Path, *,
                    force: bool = False) -> Rendered:  # fmt: skip
    """Write ``source``'s files (a ``deploy/compute-endpoint/<kind>``) into ``out`` with the
    site's values; nothing is written when anything cannot be filled in."""
    source = Path(source)
    if not (source / TEMPLATE).is_file() or not (source / "config.yaml").is_file():
        raise RenderError(f"{source}: not an endpoint directory (no {TEMPLATE} and config.yaml;"
                          " use deploy/compute-endpoint/<kind>)")  # fmt: skip
    files: dict[str, str] = {}
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        files[path.name] = path.read_text()
    files[TEMPLATE] = render_template(files[TEMPLATE], settings, str(source / TEMPLATE))
    if MAPPING in files:
        files[MAPPING] = json.dumps(identity_mapping(settings), indent=2) + "\n"
    taken = [out / name for name in files if (out / name).exists()]
    if taken and not force:
        raise RenderError(f"{taken[0]} exists already (--force to overwrite)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        (out / name).write_text(text)
        written.append(out / name)
    commands = []
    if MAPPING in files:
        commands.append(("as root, a multi-user endpoint", configure_command(out, "multi")))
    if "config.single-user.yaml" in files or MAPPING not in files:
        commands.append(("as the service account, a single-user endpoint",
                         configure_command(out, "single")))  # fmt: skip
    return Rendered(written=written, configure=commands)


def configure_command(out: Path, form: str) -> str:
    """The documented `globus-compute-endpoint configure` of the rendered files."""
    parts = ["globus-compute-endpoint configure beamflow"]
    if form == "multi":
        parts += ["--multi-user true --contact-email <you@your.site>",
                  f"--core-config {out / 'config.yaml'}",
                  f"--id-mapping-config {out / MAPPING}"]  # fmt: skip
    else:
        single = out / "config.single-user.yaml"
        parts += ["--multi-user false",
                  f"--core-config {single if single.exists() else out / 'config.yaml'}"]
    parts += [f"--template-config {out / TEMPLATE}",
              f"--schema-config {out / 'user_config_schema.json'}"]  # fmt: skip
    return " \\\n    ".join(parts)


# -- what the doctor checks ---------------------------------------------------------------------
def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines that are not comments (YAML ``#``, Jinja ``{# #}``)."""
    lines, in_comment = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if in_comment or stripped.startswith("{#"):
            in_comment = "#}" not in stripped
            continue
        if stripped.startswith("#"):
            continue
        lines.append((number, line))
    return lines


def placeholders(directory: Path) -> list[str]:
    """``file:line: text`` of every placeholder left in the endpoint's files."""
    found = []
    for path in sorted(p for p in Path(directory).iterdir() if p.is_file()):
        if path.name == "example.json":  # an example by design
            continue
        for number, line in _code_lines(path):
            if any(mark in line for mark in PLACEHOLDERS):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def hidden_failures(template: Path) -> list[str]:
    """``file:line: text`` of module commands whose failure the template hides."""
    return [f"{template}:{number}: {line.strip()}" for number, line in _code_lines(template)
            if _HIDDEN_FAILURE.match(line)]  # fmt: skip


def worker_env_of(template: Path) -> str | None:
    """The environment the workers activate by default (the template's site value)."""
    site = dict(_SITE_LINE.findall(template.read_text()))
    literal = site.get("site_beamflow_env")
    if literal is not None:
        try:
            return json.loads(literal.strip("'"))
        except ValueError:
            return None
    match = _SOURCE.search(template.read_text())
    return match.group(1).strip("\"'") if match else None


@dataclass(frozen=True)
class Reach:
    ok: bool | None  # None: cannot be told from here
    detail: str


def account_reaches(env: str, account: str) -> Reach:
    """Whether ``account`` can source ``env``/bin/activate: statically (another user's home,
    a relative path), then, where the account and the path exist on this host, by the modes
    of every directory on the way and of the file."""
    try:
        user = pwd.getpwnam(account)
    except KeyError:
        user = None
    path_text = env
    if env.startswith("$HOME/") or env == "$HOME":
        if user is None:
            return Reach(None, f"{env}: {account}'s own home, not known on this host")
        path_text = user.pw_dir + env[len("$HOME"):]
    if not path_text.startswith("/"):
        return Reach(False, f"{env}: not an absolute path")
    home = re.match(r"^/(root|home/[^/]+|Users/[^/]+)(/|$)", path_text)
    own = user.pw_dir.rstrip("/") if user else None
    if home and (own is None or not path_text.startswith(own + "/")) and \
            f"/{home.group(1)}" != own:  # fmt: skip
        return Reach(False, f"{path_text} lies in another user's home (/{home.group(1)}), "
                            f"which {account} cannot read")  # fmt: skip
    activate = Path(path_text) / "bin" / "activate"
    if user is None or not activate.exists():
        where = "" if user else f" ({account} is not an account on this host)"
        return Reach(None, f"{activate}: not checked here{where}")
    blocked = _blocked(activate, user)
    if blocked:
        return Reach(False, f"{account} cannot read {activate}: {blocked}")
    return Reach(True, f"{account} can read {activate}")


def _blocked(path: Path, user: pwd.struct_passwd) -> str | None:
    """Why ``user`` cannot read ``path`` (searching every directory above it), or None."""
    if user.pw_uid == 0:
        return None
    groups = {user.pw_gid, *os.getgrouplist(user.pw_name, user.pw_gid)}

    def allowed(p: Path, owner_bit: int, group_bit: int, other_bit: int) -> bool:
        info = p.stat()
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid == user.pw_uid:
            return bool(mode & owner_bit)
        if info.st_gid in groups:
            return bool(mode & group_bit)
        return bool(mode & other_bit)

    for parent in reversed(path.parents):
        if not allowed(parent, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return f"no search permission on {parent}"
    if not allowed(path, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH):
        return f"no read permission on {path}"
    return None
