"""What sbatch reads from a job script: its ``#SBATCH`` directives, split as sbatch splits them.

sbatch (src/sbatch/opt.c, 22.05) reads options from every line that starts, in
its first column, with "#SBATCH" or "#SLURM" (a prefix: "#SBATCH--time=5" is
one), skipping empty lines, lines of whitespace and lines whose first
non-blank character is "#", and stops at the first other line. It splits a
directive into words on C whitespace; '...' and "..." group, a backslash
escapes the next byte unless that is whitespace (which ends the word all the
same), an unquoted "#" ends the line, and a word "hetjob" or
"packjob" starts another component of a heterogeneous job. #PBS and #BSUB
lines are never read: --ignore-pbs is on every command line.
"""

from __future__ import annotations

from gpupool.errors import TenantError

_DIRECTIVE_PREFIXES = (b"#SBATCH", b"#SLURM")
_C_SPACE = b" \t\n\v\f\r"
_HETJOB_WORDS = (b"hetjob", b"packjob")


def _directive_words(text: bytes, lineno: int) -> list[str]:
    """The words of one directive after its prefix, as sbatch's get_argument() splits them."""
    words: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in _C_SPACE:
            pos += 1
        if pos == end:
            return words
        rest = text[pos:]
        for word in _HETJOB_WORDS:
            if rest[: len(word)].lower() == word and (len(rest) == len(word) or rest[len(word)] in _C_SPACE):
                raise TenantError(f"script line {lineno}: {word.decode()!r} would start another job; gpupool submits one")
        if rest.startswith(b":"):
            raise TenantError(f"script line {lineno}: sbatch refuses a word starting with ':'")
        argument = bytearray()
        quote: int | None = None
        escaped = comment = False
        while pos < end and (quote is not None or text[pos] not in _C_SPACE):
            char = text[pos]
            pos += 1
            if escaped:
                escaped = False
            elif char == ord("\\"):
                escaped = True
                continue
            elif quote is not None:
                if char == quote:
                    quote = None
                    continue
            elif char in b"\"'":
                quote = char
                continue
            elif char == ord("#"):
                comment = True
                break
            argument.append(char)
        if quote is not None:
            raise TenantError(f"script line {lineno}: unmatched {chr(quote)} in an #SBATCH line")
        if argument:
            words.append(argument.decode("utf-8", errors="replace"))
        elif not comment:
            # sbatch stops reading the line at an empty word; gpupool never writes one.
            raise TenantError(f"script line {lineno}: an empty word in an #SBATCH line")
        if comment:
            return words


def script_directives(script: bytes) -> list[str]:
    """Every option sbatch reads from ``script`` itself, in order, split as sbatch splits them."""
    if b"\x00" in script:
        raise TenantError("the job script contains a NUL byte")
    options: list[str] = []
    for lineno, line in enumerate(script.split(b"\n"), start=1):
        prefix = next((p for p in _DIRECTIVE_PREFIXES if line.startswith(p)), None)
        if prefix is not None:
            options += _directive_words(line[len(prefix) :], lineno)
            continue
        content = line.lstrip(_C_SPACE)
        if content and not content.startswith(b"#"):
            break  # the first command: sbatch reads no directive after it
    return options

