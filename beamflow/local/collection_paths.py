"""Collections as local directories: each collection id maps to a root, and a collection path
``/a/b`` means ``ROOT/a/b``. Every path, after ``..`` is collapsed and symlinks are followed,
must lie inside its collection's root; anything else is refused (:class:`TransferRefused`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TransferRefused(ValueError):
    """The request cannot start (bad body, unknown collection, a path outside a root)."""


class Collections:
    """Collection id → local root directory."""

    def __init__(self, roots: Mapping[str, Path | str]) -> None:
        self.roots: dict[str, Path] = {}
        for cid, root in roots.items():
            if not cid:
                continue
            self.roots[cid.lower()] = Path(root).expanduser().resolve()

    @classmethod
    def from_settings(cls, settings: Any) -> Collections:
        return cls(
            {
                settings.beamline.collection_id: settings.beamline.collection_root,
                settings.hpc.collection_id: settings.hpc.collection_root,
            }
        )

    def root(self, collection_id: str) -> Path:
        root = self.roots.get(collection_id.lower())
        if root is None:
            known = ", ".join(self.roots) or "none configured"
            raise TransferRefused(
                f"unknown collection {collection_id!r}: this machine maps only {known} "
                "(beamline.collection_id and hpc.collection_id in beamflow.toml)"
            )
        return root

    def local_path(self, collection_id: str, path: str, what: str) -> Path:
        """The local path of collection path ``path``; refuses anything outside the root."""
        root = self.root(collection_id)
        if "\0" in path:
            raise TransferRefused(f"{what} {path!r} contains a NUL byte")
        # Globus paths are absolute; "~/" and "/~/" name the collection's home, here its root.
        rel = path
        for prefix in ("/~/", "~/"):
            if rel.startswith(prefix):
                rel = "/" + rel[len(prefix) :]
        if rel in ("~", "/~"):
            rel = "/"
        if not rel.startswith("/"):
            raise TransferRefused(f"{what} {path!r} must be an absolute collection path ('/...')")
        resolved = (root / rel.lstrip("/")).resolve(strict=False)
        if not inside(resolved, root):
            raise TransferRefused(
                f"{what} {path!r} resolves to {resolved}, outside collection {collection_id}'s "
                f"root {root}; refused"
            )
        return resolved


def inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)
