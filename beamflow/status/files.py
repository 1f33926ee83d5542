"""``/files/{run_id}/{index|name|product}``: only files a run in the store lists."""

from __future__ import annotations

from pathlib import PurePath

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse

from beamflow.runs.records import Run
from beamflow.status import views
from beamflow.status.site import Site


def router(site: Site) -> APIRouter:
    files = APIRouter()

    @files.get("/files/{run_id}/{key}")
    def run_file(request: Request, run_id: str, key: str) -> FileResponse:
        site.require_view(request)
        run = site.get_run(run_id)
        listed = listed_file(run, key)
        if listed is None:
            raise HTTPException(404, f"run {run_id} has no file {key!r}")
        path = views.resolve_listed(listed, site.options.files_root)
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            name = PurePath(listed).name
            raise HTTPException(404, f"file of run {run_id} is missing: {name}") from None
        if not real.is_file():
            raise HTTPException(404, f"not a regular file: {PurePath(listed).name}")
        media = views.IMAGE_TYPES.get(real.suffix.lower())
        headers = {"cache-control": "no-cache"}
        if media is None:  # never let a browser render anything but an image inline
            return FileResponse(
                real, media_type="application/octet-stream", filename=real.name, headers=headers
            )
        return FileResponse(real, media_type=media, headers=headers)

    return files


def listed_file(run: Run, key: str) -> str | None:
    """The store's entry that ``key`` names: an index into previews, a file name, or product.

    The key only selects among the paths the run lists; it never becomes part of a path.
    """
    if key == "product":
        return run.product
    if key.isdigit():
        index = int(key)
        return run.previews[index] if index < len(run.previews) else None
    for entry in reversed(run.previews):  # the newest file of that name
        if PurePath(entry).name == key:
            return entry
    if run.product and PurePath(run.product).name == key:
        return run.product
    return None
