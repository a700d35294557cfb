"""A job's outputs on its page: a page of one of its output folders, each file a download, and the whole folder as one tar.

The listing is ``GET /jobs/<id>/outputs/``'s (api.outputs: the same checks, the
run-as helper reading as the job's user), shown as the Files page shows a
folder (api.web.listing). Downloads go through the pages' cookie data routes
(``/ui/data/jobs/<id>/outputs/...``, api.web.pages), which answer only the
site's own pages, as the Files page's do.
"""

from __future__ import annotations

from typing import Any

from flask import request, url_for

from api import outputs as outputs_api
from api.context import app_state, principal
from api.web import listing
from gpupool.errors import NotFound, ServiceUnavailable

# Entries on one page of an output folder; the next page is a link (the API's cursor).
PAGE_ENTRIES = 100
# The page's query parameters: the output folder shown, and the cursor of its page.
FOLDER_ARG = "outputs"
CURSOR_ARG = "outputs_cursor"


def _retention_text() -> str:
    days = app_state().settings.job_output_retention_days
    return "kept until you delete the job's folder" if days == 0 else f"kept for {days} days after the job ends"


def outputs_section(view: dict[str, Any]) -> dict[str, Any] | None:
    """What the job page shows of the job's outputs; None for a job of another account (an operator's view reads none)."""
    job_id = view["job_id"]
    if view["account"] != principal().account:
        return None

    def folder_url(path: str, cursor: str | None = None) -> str:
        args: dict[str, Any] = {name: value for name, value in ((FOLDER_ARG, path), (CURSOR_ARG, cursor)) if value}
        return url_for("web.job", job_id=job_id, _anchor="outputs", **args)

    def file_url(path: str) -> str:
        return url_for("web_data.job_output_data", job_id=job_id, path=path)

    where = listing.folder_path(request.args.get(FOLDER_ARG, ""))
    cursor = request.args.get(CURSOR_ARG) or None
    section: dict[str, Any] = {
        "crumbs": listing.crumbs(where, "Outputs", folder_url),
        "parent_url": listing.parent_url(where, folder_url),
        "tar_url": url_for("web_data.job_outputs_tar", job_id=job_id),
        "retention": _retention_text(),
        "rows": [], "unlisted": 0, "next_url": None, "first_url": None, "problem": None,
    }
    try:
        page = outputs_api.output_listing(job_id, where, limit=PAGE_ENTRIES, cursor=cursor)
    except NotFound as exc:
        # At the top: the job has not made its output folder yet (it has not started), or retention removed it.
        if not where.is_root:
            section["problem"] = exc.message
        elif view["started_at"] is None:
            section["problem"] = "No outputs yet: the job has not started."
        else:
            section["problem"] = "No output folder: the job made none, or the site's retention has removed it."
        return section
    except ServiceUnavailable as exc:
        section["problem"] = exc.message  # the page still shows the job; its outputs once the helper answers again
        return section
    assert page is not None  # a folder's path: the agent refuses a file (409 not_a_folder)
    section.update(
        rows=listing.rows(where, page["entries"], folder_url, file_url),
        unlisted=page["unlisted"],
        next_url=folder_url(where.text, page["next_cursor"]) if page["next_cursor"] else None,
        first_url=folder_url(where.text) if cursor else None,
    )
    return section
