#!/usr/bin/env python3
"""Runs tests/gcs/fake_gcs.py (same arguments, same output) with its
pure-Python CRC32C replaced by the C one of the `crc32c` module (Debian's
python3-crc32c). The pure-Python loop checksums a few MB/s, which would make
the fake server, not the gateway, the figure bench/snapshots measures for a
1 GiB upload. Nothing else of the fake server changes."""

import os
import sys

import crc32c

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gcs"))
import fake_gcs  # noqa: E402


def fast_crc32c(data, crc=0):
    """CRC32C of `data`, continuing from `crc` (fake_gcs.crc32c's contract)."""
    return crc32c.crc32c(data, crc)


if __name__ == "__main__":
    fake_gcs.crc32c = fast_crc32c
    fake_gcs.main()
