"""Whether a tar stream ended as a whole archive: what the service checks of the job's user's archive as it relays it.

Pure. A tar archive ends with two zero blocks (and tarfile's 'w|' pads it to a
whole record); the storage agent's writer ends a stream it could not finish
with a block of 0xff bytes instead (gpupool.storage.agent.TAR_BROKEN_END), so a
cut-off archive is never taken for a whole one.
"""

from __future__ import annotations

BLOCK = 512
END_BYTES = 2 * BLOCK


class TarTail:
    """The last bytes of a stream and its length, fed a chunk at a time (constant memory)."""

    def __init__(self) -> None:
        self.length = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        self.length += len(chunk)
        self._tail = (self._tail + chunk[-END_BYTES:])[-END_BYTES:]

    def complete(self) -> bool:
        """Whole blocks, ending with the two zero blocks of a tar archive's end."""
        return self.length >= END_BYTES and self.length % BLOCK == 0 and self._tail == bytes(END_BYTES)
