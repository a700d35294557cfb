"""Raw sacct output kept for audits: gzip files named by their content hash.

Compression runs in a thread while the pass parses and writes: zlib releases
the GIL, so on two cores the archive costs the pass almost nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
import zlib
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"


def read_text(path: Path) -> str:
    """A sacct dump, gzip-compressed or not."""
    data = path.read_bytes()
    if data[:2] == GZIP_MAGIC:
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


class Archiver(threading.Thread):
    """Hashes and gzips ``text`` into ``directory`` in the background; ``result()`` joins."""

    def __init__(self, text: str, directory: Path, stem: str) -> None:
        super().__init__(name="gpupool-archive", daemon=True)
        self._data = text.encode("utf-8")
        self._directory = directory
        self._stem = stem
        self._path: Path | None = None
        self._sha256 = ""
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._sha256 = hashlib.sha256(self._data).hexdigest()
            self._directory.mkdir(parents=True, exist_ok=True)
            path = self._directory / f"{self._stem}-{self._sha256[:16]}.psv.gz"
            if not path.exists():
                # Level 1: sacct text still shrinks about 8x, at several times level 6's speed.
                compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
                partial = path.with_suffix(".partial")
                with open(partial, "wb") as handle:
                    handle.write(compressor.compress(self._data))
                    handle.write(compressor.flush())
                    handle.flush()
                    os.fsync(handle.fileno())
                partial.replace(path)
            self._path = path
        except BaseException as exc:  # reported to the pass by result()
            self._error = exc

    def result(self) -> tuple[Path, str]:
        self.join()
        if self._error is not None:
            raise self._error
        assert self._path is not None
        return self._path, self._sha256
