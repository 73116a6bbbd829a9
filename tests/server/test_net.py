"""Loopback hosts (server/net.py): where a server with no authentication may listen."""

from __future__ import annotations

import pytest

from voxwire.server.net import LOOPBACK_HOSTS, is_loopback


@pytest.mark.parametrize("host", [
    *sorted(LOOPBACK_HOSTS), "LocalHost", "localhost.", "127.0.0.2", "127.1.2.3", "127.255.255.254",
    "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "::ffff:127.9.9.9",
])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", [
    "", "0.0.0.0", "::", "10.0.0.1", "192.168.1.10", "128.0.0.1", "126.255.255.255", "::2",
    "::ffff:10.0.0.1", "fe80::1", "example.com", "localhost.example.com", "my-localhost", "127.0.0.1.nip.io",
    "[::1]", "127.0.0.1:8000",
])
def test_anything_else_is_not_loopback(host):
    """Wildcards, other addresses, and names: a name other than localhost may resolve anywhere."""
    assert not is_loopback(host)


def test_the_usual_spellings_are_the_ones_both_doors_used():
    assert frozenset({"127.0.0.1", "localhost", "::1"}) == LOOPBACK_HOSTS
