"""sacct output for tests that fill a ledger by replay: as the billing pass gets it from sacct.

The pass asks sacct for its own unpredictable delimiter, so a job name's ``|`` or
newline is only text; a ``|``-separated dump holding a gpupool tenant's rows is
refused (``billing.sacct``). Tests write their rows with ``|``, which is easy to
read, and ``as_pass_output`` puts them in the pass's shape.
"""

from __future__ import annotations

from collections.abc import Sequence

# The shape of gpupool.slurm.parse.unpredictable_delimiter(): fixed here, so a dump is reproducible.
PASS_DELIMITER = "|5f2a9c7e01bd|"


def as_pass_output(lines: Sequence[str], delimiter: str = PASS_DELIMITER) -> str:
    """``|``-separated lines, the header first and the job name last, separated by ``delimiter`` instead.

    Each line splits into at most the header's number of fields, so a ``|`` in a
    name stays in it; a line of fewer fields (a name's next line) is kept as it is.
    """
    width = lines[0].count("|") + 1
    out = []
    for line in lines:
        fields = line.split("|", width - 1)
        out.append(delimiter.join(fields) if len(fields) == width else line)
    return "\n".join(out) + "\n"
