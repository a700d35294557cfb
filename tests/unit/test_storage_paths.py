"""What a customer may name in its storage, and sizes as operators write them."""

from __future__ import annotations

import pytest

from gpupool.errors import BadRequest
from gpupool.storage.paths import StoragePath, parse_file_path, parse_path, upload_key
from gpupool.storage.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "parts", "folder"),
    [
        ("", (), True),
        ("a", ("a",), False),
        ("a/b/c.txt", ("a", "b", "c.txt"), False),
        ("a/b/", ("a", "b"), True),
        ("é spaced name/…", ("é spaced name", "…"), False),
        ("back\\slash", ("back\\slash",), False),
        ("..hidden/.x", ("..hidden", ".x"), False),
        ("n" * 255, ("n" * 255,), False),
    ],
)
def test_plain_relative_paths_are_taken_as_names(text: str, parts: tuple[str, ...], folder: bool) -> None:
    assert parse_path(text) == StoragePath(parts, folder)


@pytest.mark.parametrize(
    "text",
    ["..", "../x", "a/../b", "a/./b", ".", "/etc/passwd", "//x", "a//b", "a\x00b", "line\nbreak", "tab\there", "del\x7f",
     "n" * 256, "é" * 128, "a/" * 2049, ".gpupool-uploads/x", ".gpupool-uploads/"],
)
def test_every_other_path_is_a_400_naming_why(text: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_path(text)
    assert refused.value.code == "path_invalid"


def test_a_file_path_is_not_a_folder_and_not_the_top() -> None:
    assert parse_file_path("a/b").parts == ("a", "b")
    for text in ("", "a/"):
        with pytest.raises(BadRequest):
            parse_file_path(text)


def test_an_upload_key_is_the_paths_own_and_fixed() -> None:
    assert upload_key(parse_path("a/b")) == upload_key(parse_path("a/b"))
    assert upload_key(parse_path("a/b")) != upload_key(parse_path("a/c"))
    assert len(upload_key(parse_path("n" * 255 + "/" + "m" * 255))) == 64  # fits any name length


@pytest.mark.parametrize(("text", "size"), [("1048576", 1 << 20), ("500G", 500 << 30), ("16M", 16 << 20), ("2TiB", 2 << 40), ("10 gb", 10 << 30)])
def test_sizes_are_binary(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5T", "-1G", "G", "10X", "1e9"])
def test_sizes_that_are_not_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_sizes_read_back() -> None:
    assert [format_size(size) for size in (500 << 30, 1536 << 20, 1000, 16 << 20)] == ["500 GiB", "1.5 GiB", "1000 B", "16 MiB"]
