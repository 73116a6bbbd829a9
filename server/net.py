"""Which listening addresses are loopback: reachable only from this machine.

A server with no authentication may only listen on loopback, since anyone who can reach
its port can use it: ``voxwire serve`` with no API key warns on any other host
(server/cli.py), and the Wyoming door, which has no authentication at all, stays on
loopback when API keys are set (server/doors/wyoming/). Both ask ``is_loopback``, so
the two agree on what loopback is.
"""

from __future__ import annotations

import ipaddress

LOOPBACK_HOSTS: frozenset[str] = frozenset({"127.0.0.1", "localhost", "::1"})
"""The loopback hosts as usually written. ``is_loopback`` also takes the rest of
127.0.0.0/8 and any spelling of ::1."""


def is_loopback(host: str) -> bool:
    """True if a socket bound to ``host`` is reachable only from this machine: ``localhost``
    (by name, in any case, as resolvers treat it), any 127.x.x.x address, ::1, and IPv4
    loopback written as IPv6 (::ffff:127.0.0.1). False for anything else, the wildcard
    addresses ("", 0.0.0.0, ::) and other host names included: a name could resolve to
    any address."""
    if host in LOOPBACK_HOSTS or host.lower() in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def unauthenticated_host(host: str, api_keys_set: bool, allow_unauthenticated: bool) -> str:
    """Where a door without authentication (Wyoming) listens: ``host``, but with API keys
    set, loopback unless the operator allows otherwise, since anyone reaching it would
    bypass the keys. The door (server/doors/wyoming/) and, under ``--workers``, the parent
    that claims its port for the workers (server/cli.py) ask this one place."""
    if api_keys_set and not allow_unauthenticated and not is_loopback(host):
        return "127.0.0.1"
    return host
