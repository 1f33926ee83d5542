"""The docs stay true to the code.

- Every `beamflow ...` command in the README's, the quickstart's and the deployment guide's
  code blocks names a real command, uses only options that command has, and its `--help`
  works.
- Every relative link (and image) in README.md and docs/*.md points at an existing file,
  and every `#anchor` at a heading of the linked page.
- README.md starts with the two commands, `make demo` and `make test`, and the Makefile has
  both targets; its first screen shows a first `beamflow reconstruct FILE` and links the
  deployment guide.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from beamflow.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
COMMAND_DOCS = [README, DOCS / "quickstart.md", DOCS / "deployment.md"]
LINKED_DOCS = [README, *sorted(DOCS.glob("*.md"))]

# Code blocks in these languages hold files (configuration, JSON), not commands.
NOT_SHELL = {"toml", "ini", "json", "yaml", "text", "python", "py"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")

runner = CliRunner()
# typer ships its own click: commands are told apart by what they have, not by class.
CLI: Any = typer.main.get_command(app)


# -- reading markdown -----------------------------------------------------------------------
def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced code block."""
    blocks: list[tuple[str, list[str]]] = []
    lang: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, lines = fence.group(2).lower(), []
        elif fence:
            blocks.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def beamflow_commands(path: Path) -> list[list[str]]:
    """The argument lists of every `beamflow ...` command in the doc's shell code blocks."""
    commands: list[list[str]] = []
    for lang, lines in code_blocks(path.read_text()):
        if lang in NOT_SHELL:
            continue
        joined = "\n".join(lines).replace("\\\n", " ")
        for line in joined.splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            try:
                tokens = list(lexer)
            except ValueError as exc:  # unbalanced quotes: say which line
                raise AssertionError(f"{path.name}: cannot parse {line!r}: {exc}") from None
            segment: list[str] = []
            for token in [*tokens, ";"]:
                if token not in SEPARATORS:
                    segment.append(token)
                    continue
                while segment and (ENV_ASSIGNMENT.match(segment[0]) or segment[0] == "sudo"):
                    segment.pop(0)
                # beamflow-as-agent (deploy/systemd) runs a beamflow command as the agent.
                if segment and Path(segment[0]).name in ("beamflow", "beamflow-as-agent"):
                    commands.append(segment[1:])
                segment = []
    return commands


def is_group(command: Any) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


def resolve(args: list[str]) -> tuple[list[str], Any, list[str]]:
    """(subcommand path, the command, the remaining arguments) of a `beamflow` line."""
    command = CLI
    path: list[str] = []
    rest = list(args)
    while rest and is_group(command) and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
        path.append(command.name or "")
    return path, command, rest


def option_names(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        if param.param_type_name == "option":
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def documented_commands() -> list[tuple[str, list[str]]]:
    return [(doc.name, args) for doc in COMMAND_DOCS for args in beamflow_commands(doc)]


DOCUMENTED = documented_commands()


# -- commands -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "args"), DOCUMENTED, ids=[f"{d}:beamflow {' '.join(a)}" for d, a in DOCUMENTED]
)
def test_documented_command_exists_with_these_options(doc: str, args: list[str]) -> None:
    path, command, rest = resolve(args)
    shown = f"{doc}: `beamflow {' '.join(args)}`"
    assert path, f"{shown} names no beamflow command"
    if is_group(command):
        assert not [a for a in rest if not a.startswith("-")], (
            f"{shown}: {rest[0]!r} is not a command of `beamflow {' '.join(path)}` "
            f"(it has: {', '.join(sorted(command.commands))})"
        )
    known = option_names(command)
    unknown = [a.split("=", 1)[0] for a in rest
               if a.startswith("-") and a.split("=", 1)[0] not in known]  # fmt: skip
    assert not unknown, f"{shown}: `beamflow {' '.join(path)}` has no option {unknown}"


def first_day_commands() -> list[list[str]]:
    """The argument lists of the `beamflow ...` commands in the first-day table of the
    deployment guide (inline code in table rows, in order)."""
    text = (DOCS / "deployment.md").read_text()
    section = text.split("## The first day", 1)[1].split("\n## ", 1)[0]
    found = []
    for row in (line for line in section.splitlines() if line.startswith("| ")):
        command = row.split("|")[2]
        for span in re.findall(r"`([^`]+)`", command):
            tokens = shlex.split(span)
            while tokens and tokens[0] == "sudo":
                tokens.pop(0)
            if tokens and tokens[0] in ("beamflow", "beamflow-as-agent"):
                found.append(tokens[1:])
    return found


def test_the_first_day_table_runs_real_commands_as_the_agent() -> None:
    """Every check of the first-day recipe is a real command with real options, and the
    smoke test runs as the agent: doctor, the probe as the agent, then a scan."""
    commands = first_day_commands()
    for args in commands:
        test_documented_command_exists_with_these_options("deployment.md (first day)", args)
    order = [" ".join(args) for args in commands]
    assert order.index("doctor") < order.index("doctor --probe --as-agent") < next(
        i for i, c in enumerate(order) if c.startswith("runs start"))
    assert any(c.startswith("render-endpoint") for c in order)
    assert any(c.startswith("cleanup --dry-run") for c in order)


HELP_PATHS = sorted({tuple(resolve(args)[0]) for _, args in DOCUMENTED if resolve(args)[0]})


@pytest.mark.parametrize("path", HELP_PATHS, ids=lambda p: "beamflow " + " ".join(p))
def test_help_of_documented_command_works(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, f"`beamflow {' '.join(path)} --help` failed:\n{result.output}"
    assert "Usage" in result.output


@pytest.mark.parametrize(
    ("doc", "needed"),
    [
        ("quickstart.md", ["demo", "init", "simulate", "agent", "serve", "reconstruct",
                           "runs list", "runs show"]),
        ("deployment.md", ["init", "login", "register functions", "register flows", "doctor",
                           "runs start", "serve"]),
    ],
)  # fmt: skip
def test_guide_walks_through_its_steps(doc: str, needed: list[str]) -> None:
    shown = {" ".join(resolve(args)[0]) for d, args in DOCUMENTED if d == doc}
    missing = [n for n in needed if n not in shown]
    assert not missing, f"{doc} has no code-block command for: {missing}"


def test_command_parser_sees_chains_env_and_comments(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "```\n"
        "cd ws && BEAMFLOW_STATUS__PORT=9000 beamflow serve --port 9000  # comment --bogus\n"
        ".venv/bin/beamflow reconstruct scan \\\n  --out o\n"
        "echo beamflow\n"
        "```\n"
        "```toml\nbeamflow = 1\n```\n"
    )
    assert beamflow_commands(doc) == [["serve", "--port", "9000"],
                                      ["reconstruct", "scan", "--out", "o"]]  # fmt: skip


# -- links ----------------------------------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
HTML = re.compile(r"<(?:img|a)\s[^>]*?(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def links(path: Path) -> list[str]:
    text = prose(path.read_text())
    found = LINK.findall(text) + REFERENCE.findall(text) + HTML.findall(text)
    return [t for t in found if not SCHEME.match(t)]


def slugs(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    inside = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if inside or not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_existing_files(doc: Path) -> None:
    broken = []
    for target in links(doc):
        file_part, _, anchor = target.partition("#")
        file = (doc.parent / file_part).resolve() if file_part else doc
        if not file.exists():
            broken.append(f"{target} (no such file: {file})")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    assert not broken, f"{doc.name}: broken links: {broken}"


def test_link_checker_finds_links_and_anchors(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text(
        "# Top `code` (x)\n\n## Top code x\n\nSee [b](b.md#part) and ![i](img/i.png), "
        "[web](https://example.org), `[not](a/link)`.\n\n```\n[nor](this)\n```\n"
    )
    assert links(doc) == ["b.md#part", "img/i.png"]
    assert slugs(doc) == {"top-code-x", "top-code-x-1"}


# -- README ---------------------------------------------------------------------------------
def test_readme_starts_with_make_demo_and_make_test() -> None:
    lines = README.read_text().splitlines()
    while lines and (not lines[0].strip() or lines[0].startswith("# ")):
        lines.pop(0)  # a title may come first
    assert lines and FENCE.match(lines[0]), "README.md must open with a code block"
    first_block = code_blocks("\n".join(lines))[0][1]
    commands = [c.split("#", 1)[0].strip() for c in first_block if c.split("#", 1)[0].strip()]
    assert commands[:2] == ["make demo", "make test"], commands
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"Makefile has no {target}:"


def test_readmes_first_screen_reconstructs_a_file_and_links_deployment() -> None:
    """A beamline scientist's first screen (a terminal's 40 lines): a scan of their own
    reconstructed, and where a facility deployment is described."""
    first = "\n".join(README.read_text().splitlines()[:40])
    commands = [args for lang, lines in code_blocks(first) if lang not in NOT_SHELL
                for args in (shlex.split(line, comments=True) for line in lines) if args]
    reconstruct = [a for a in commands if Path(a[0]).name == "beamflow" and a[1:2] ==
                   ["reconstruct"]]
    assert reconstruct, first
    assert reconstruct[0][2].endswith(("_master.h5", ".cxi")) and "--out" in reconstruct[0]
    assert "(docs/deployment.md)" in first


# -- `beamflow init`'s next steps --------------------------------------------------------------
def test_init_suggests_the_quickstarts_first_steps_in_its_order() -> None:
    from beamflow.cli.workspace import FIRST_STEPS

    quickstart = [" ".join(args) for args in beamflow_commands(DOCS / "quickstart.md")]
    at = [quickstart.index(command.removeprefix("beamflow ")) for command, _ in FIRST_STEPS]
    assert at == sorted(at), (at, quickstart)
