"""The README's quick start as a newcomer reads it: its first command and the curl submit `make run` prints."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> str:
    text = README.read_text()
    start = text.index("\n## Quick start\n")
    following = text.find("\n## ", start + 1)
    return text[start : following if following != -1 else len(text)]


def sh_blocks(markdown: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", markdown, re.DOTALL)


def readme_first_command() -> str:
    """The quick start's first command, without its comment."""
    blocks = sh_blocks(quick_start())
    assert blocks, "no sh block in the README's quick start"
    return blocks[0].splitlines()[0].split("#", 1)[0].strip()


def readme_submit() -> str:
    """The curl submit in the quick start's block that shows what `make run` prints (the one with `export TOKEN=`)."""
    printed = [block for block in sh_blocks(quick_start()) if "export TOKEN=" in block]
    assert len(printed) == 1, "the README's quick start shows `export TOKEN=` in no sh block, or in several"
    block = printed[0]
    assert "curl -s -X POST" in block, "the quick start's printed block has no `curl -s -X POST` submit"
    return block[block.index("curl -s -X POST") :].strip()
