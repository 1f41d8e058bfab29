"""ringreduce/sizes.py: the one parser and formatter of message sizes (the benchmark, the cost
model and the scripts in benchmarks/ use it)."""

import argparse

import pytest

from ringreduce import sizes


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("1", 1),
        ("1024", 1024),
        ("1K", 1024),
        ("1k", 1024),
        ("64M", 64 << 20),
        ("2G", 2 << 30),
        ("4KB", 4096),
        ("4KiB", 4096),
    ],
)
def test_parse_size(text, nbytes):
    assert sizes.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "1.5K", "-1K", "1X", "1 K B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="cannot parse size"):
        sizes.parse_size(text)


def test_size_sweep():
    assert sizes.size_sweep(1024, 64 << 10, 4) == [1024, 4096, 16384, 65536]
    assert sizes.size_sweep(1024, 1024, 4) == [1024]
    assert sizes.size_sweep(1000, 5000, 2) == [1000, 2000, 4000]


def test_size_arg_is_an_argparse_type_with_the_parsers_message():
    with pytest.raises(argparse.ArgumentTypeError, match="cannot parse size '1X'"):
        sizes.size_arg("1X")
    assert sizes.size_arg("8K") == 8192


@pytest.mark.parametrize("nbytes, text", [(1, "1B"), (1024, "1KiB"), (3 << 20, "3MiB"), (1 << 30, "1GiB"),
                                          (1536, "1536B")])
def test_format_size(nbytes, text):
    assert sizes.format_size(nbytes) == text
