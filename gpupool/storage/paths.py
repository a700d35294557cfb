"""What a customer may name in its storage: relative paths of plain names, checked before anything opens them.

Pure: no filesystem. The run-as helper's agent checks again (it never trusts
its caller), and resolves the path beneath the account's root without
following any link, so this is for a clear 400 rather than the only guard.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from gpupool.errors import BadRequest

# Linux's NAME_MAX and PATH_MAX, in bytes of UTF-8.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
# Uploads in progress, at the top of each account's storage (not listed, not addressable).
UPLOADS_DIR = ".gpupool-uploads"
# Control characters make names that no listing or shell shows as they are.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class StoragePath:
    """A path in an account's storage: its names from the top, and whether it names a folder (a trailing ``/``)."""

    parts: tuple[str, ...]
    folder: bool

    @property
    def text(self) -> str:
        return "/".join(self.parts) + ("/" if self.folder and self.parts else "")

    @property
    def is_root(self) -> bool:
        return not self.parts


def _invalid(message: str) -> BadRequest:
    return BadRequest(message, code="path_invalid")


def parse_path(text: str) -> StoragePath:
    """``a/b/c`` (a file or a folder), ``a/b/`` (a folder) or ``""`` (the top), or BadRequest saying what is wrong."""
    if "\x00" in text:
        raise _invalid("a path must not contain a NUL byte")
    if text.startswith("/"):
        raise _invalid("a path is relative to your storage: it must not start with '/'")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise _invalid(f"a path is at most {MAX_PATH_BYTES} bytes")
    folder = text == "" or text.endswith("/")
    body = text[:-1] if text.endswith("/") else text
    parts = tuple(body.split("/")) if body else ()
    for name in parts:
        if name == "":
            raise _invalid("a path must not contain an empty name ('//')")
        if name in (".", ".."):
            raise _invalid("a path must not contain '.' or '..'")
        if _CONTROL.search(name):
            raise _invalid("a name must not contain control characters")
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise _invalid("a path must be UTF-8 text") from None
        if size > MAX_NAME_BYTES:
            raise _invalid(f"a name is at most {MAX_NAME_BYTES} bytes; {name[:40]!r}... has {size}")
    if parts and parts[0] == UPLOADS_DIR:
        raise _invalid(f"{UPLOADS_DIR} holds uploads in progress and cannot be named")
    return StoragePath(parts, folder)


def parse_file_path(text: str) -> StoragePath:
    """A path that must name a file: not the top, no trailing ``/``."""
    path = parse_path(text)
    if path.folder:
        raise _invalid("name a file here, not a folder (no trailing '/')")
    return path


def upload_key(path: StoragePath) -> str:
    """The name of ``path``'s upload in progress in UPLOADS_DIR: the same for every upload of that path."""
    return hashlib.sha256("/".join(path.parts).encode("utf-8")).hexdigest()


def account_storage_dir(storage_root: str, account: str) -> str:
    """Where an account's storage is mounted: what jobs get as $GPUPOOL_DATA (compared as text by the run-as helper)."""
    return f"{storage_root.rstrip('/')}/{account}"
