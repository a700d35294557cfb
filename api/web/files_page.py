"""The Files page: a folder of the account's storage, with downloads, uploads, new folders and deletes.

Everything goes through ``api.files``, the same views and storage calls as
``/files`` (the run-as helper opens every file as the account's Unix user), so
the page refuses exactly what the API refuses. The page's script uploads and
downloads through ``/ui/data/files/...``: ``/files`` itself keeps to bearer
tokens, and the data routes take the page's cookie (``SameSite=Strict``, path
``/ui``), answer only requests from the page's own origin (``Sec-Fetch-Site``)
and want the page's CSRF value in a header on every write (api.web.pages).
"""

from __future__ import annotations

from flask import Response, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from api import files as files_api
from api.context import app_state, principal
from api.errors import status_for
from api.web import listing
from api.web.pages import web_bp, web_data_bp
from gpupool.errors import BadRequest, GpupoolError
from gpupool.storage.sizes import format_size
from gpupool.storage.volumes import volume_usage

# Entries on one page of a folder; the next page is a link (the API's cursor).
PAGE_ENTRIES = 100


def _folder_url(path: str) -> str:
    return url_for("web.files", path=path)


def _file_url(path: str) -> str:
    return url_for("web_data.file_data", path=path)


def _files_page(folder: str, *, error: GpupoolError | None = None) -> tuple[str, int]:
    settings = app_state().settings
    if not settings.storage_root:
        return render_template("web/files.html", enabled=False, error=None), 200
    where = listing.folder_path(folder)
    cursor = request.args.get("cursor") or None
    page = files_api.folder_listing(where, limit=PAGE_ENTRIES, cursor=cursor)
    if page is None:
        raise BadRequest(f"{where.text[:-1]} is a file, not a folder: download it from its folder's page", code="not_a_folder")
    usage = volume_usage(settings, principal().account)
    return (
        render_template(
            "web/files.html",
            enabled=True,
            folder=where.text,
            crumbs=listing.crumbs(where, "Your storage", _folder_url),
            parent_url=listing.parent_url(where, _folder_url),
            rows=listing.rows(where, page["entries"], _folder_url, _file_url),
            unlisted=page["unlisted"],
            next_url=url_for("web.files", path=where.text, cursor=page["next_cursor"]) if page["next_cursor"] else None,
            first_url=url_for("web.files", path=where.text) if cursor else None,
            # The script puts each file's name, quoted, in place of NAME.
            upload_url=url_for("web_data.put_file_data", path=where.text + "NAME"),
            usage=usage,
            usage_text=(format_size(usage.stored_bytes), format_size(usage.available_bytes)) if usage is not None else None,
            error=error,
        ),
        status_for(error) if error is not None else 200,
    )


@web_bp.get("/files/", defaults={"path": ""}, merge_slashes=False)
@web_bp.get("/files/<storage_path:path>", merge_slashes=False)
def files(path: str) -> BaseResponse | tuple[str, int]:
    if path and not path.endswith("/"):
        # The page is a folder's; its address ends in / as the API's listing does.
        return redirect(url_for("web.files", path=path + "/"), code=308)
    return _files_page(path)


def _refused_or_raise(folder: str, error: GpupoolError) -> tuple[str, int]:
    if status_for(error) >= 500:
        raise error
    return _files_page(folder, error=error)


@web_bp.post("/files/delete")
def delete_file_page() -> BaseResponse | tuple[str, int]:
    """A file, link or empty folder of the page's folder (a folder with files in it is refused, as the API does)."""
    folder = request.form.get("folder", "")
    try:
        files_api.delete_file(request.form.get("path", ""))
    except GpupoolError as exc:
        return _refused_or_raise(folder, exc)
    return redirect(url_for("web.files", path=folder), code=303)


@web_bp.post("/files/mkdir")
def make_folder_page() -> BaseResponse | tuple[str, int]:
    folder = request.form.get("folder", "")
    name = request.form.get("name", "").strip()
    try:
        if not name or "/" in name:
            raise BadRequest("a folder's name is one name, without '/'", code="path_invalid")
        # PUT /files/<folder>/ makes a folder and reads no body.
        files_api.put_file(listing.folder_path(folder).text + name + "/")
    except GpupoolError as exc:
        return _refused_or_raise(folder, exc)
    return redirect(url_for("web.files", path=folder), code=303)


# The page's script: downloads (a link) and uploads (PUT with the CSRF header, for its progress bar).


@web_data_bp.get("/files/<storage_path:path>", merge_slashes=False)
def file_data(path: str) -> Response:
    return files_api.get_file(path)


@web_data_bp.put("/files/<storage_path:path>", merge_slashes=False)
def put_file_data(path: str) -> Response:
    return files_api.put_file(path)
