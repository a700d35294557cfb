"""A page of a folder as the pages show it: the Files page's folders and a job's output folders.

The listing itself is the API's (``api.downloads.listing_document``); this adds
what a page needs around it: each entry's size as text and its link (a
folder's page, a file's download through a cookie data route), the way up, and
the breadcrumbs. Each page says where its folders and files are reached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpupool.storage.paths import StoragePath, parse_path
from gpupool.storage.sizes import format_size

# A folder's page from its path text ("" at the top, else "a/b/"); a file's download from its path.
FolderUrl = Callable[[str], str]
FileUrl = Callable[[str], str]


def folder_path(text: str) -> StoragePath:
    """The folder ``text`` names (the API's path rules), as a folder whether or not it ends in /."""
    where = parse_path(text)
    return StoragePath(where.parts, True)


def crumbs(where: StoragePath, top: str, folder_url: FolderUrl) -> list[dict[str, str]]:
    """The folders from the top (called ``top``) down to this one, each with its page's address."""
    shown = [{"name": top, "url": folder_url("")}]
    for depth in range(1, len(where.parts) + 1):
        shown.append({"name": where.parts[depth - 1], "url": folder_url("/".join(where.parts[:depth]) + "/")})
    return shown


def parent_url(where: StoragePath, folder_url: FolderUrl) -> str | None:
    if where.is_root:
        return None
    above = where.parts[:-1]
    return folder_url("/".join(above) + "/" if above else "")


def rows(where: StoragePath, entries: list[dict[str, Any]], folder_url: FolderUrl, file_url: FileUrl) -> list[dict[str, Any]]:
    """The listing's entries with their path, size text and link (none for a link or anything else: never followed)."""
    prefix = where.text
    shown = []
    for entry in entries:
        path = prefix + entry["name"]
        row = dict(entry, path=path, size_text=format_size(entry["size"]) if entry["size"] is not None else "")
        if entry["type"] == "folder":
            row["url"] = folder_url(path + "/")
        elif entry["type"] == "file":
            row["url"] = file_url(path)
        shown.append(row)
    return shown
