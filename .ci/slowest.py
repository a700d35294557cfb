"""The slowest tests of a CI run, from the JUnit XML files its pytest runs wrote.

Usage: python .ci/slowest.py [--top N] FILE.xml...   (each file named for its tier)
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def slowest(files: list[Path], top: int) -> list[tuple[float, str, str]]:
    timings = []
    for path in files:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            print(f"slowest: {path}: {exc}", file=sys.stderr)
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            timings.append((float(case.get("time") or 0), path.stem, name))
    return sorted(timings, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for seconds, tier, name in slowest(args.files, args.top):
        print(f"{seconds:8.1f} s  {tier:<16} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
