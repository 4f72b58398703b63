"""Who a client is, for the servers' per-client shares (sessions, instances, connections).

Both servers (the WebShop site and the env server) hold each client to a share of what they have, so that one
client cannot take everything from the others. A share is only as good as the identity it counts: counted per
source address, a client with several addresses on one host (any of ``127.0.0.0/8`` on loopback, several IPv6
addresses of one interface) takes several shares. So a client is a **host**, as far as the server can tell:

* every loopback address (``127.0.0.0/8``, ``::1``, IPv4-mapped ``::ffff:127.x.y.z``) is one client,
  ``loopback``: the server's own host;
* an IPv6 address counts as its ``/64`` (one interface's addresses, privacy addresses included);
* an IPv4 address is itself (a host's addresses are not told apart from several hosts').

Several clients on one host (a trainer and an evaluation beside the server) therefore share one host's share.
To give them shares of their own, the operator hands out **client tokens**: a file with one token per line
(``--client-tokens FILE``; blank lines and ``#`` comments are skipped). A request that carries
``Authorization: Bearer <token>`` with a token of the file counts as that token's client, wherever it comes
from; a request with an unknown token is refused (401), so a mistyped token is never silently counted as its
host; a request without one counts as its host. Tokens name clients, they do not make a server safe to expose:
with or without them the servers belong behind a firewall or an authenticating proxy (docs/hosting.md). Behind
a reverse proxy every client has the proxy's address, so tokens are the way to tell clients apart there.

The connection share is counted when a connection is accepted, before any header is read: it is per host.

Example:
    >>> client_host("127.0.0.2"), client_host("::ffff:127.0.0.1"), client_host("::1")
    ('loopback', 'loopback', 'loopback')
    >>> client_host("2001:db8::1"), client_host("2001:db8::2:3"), client_host("10.0.0.7")
    ('2001:db8::/64', '2001:db8::/64', '10.0.0.7')
    >>> tokens = ClientTokens(["alice-token-1234", "bob-token-5678"])
    >>> tokens.identify("Bearer bob-token-5678", "10.0.0.7"), tokens.identify(None, "127.0.0.5")
    ('token #2', 'loopback')
"""

from __future__ import annotations

import argparse
import functools
import hmac
import ipaddress
from collections.abc import Iterable
from pathlib import Path

from progpo_base.usage import UsageError

#: The identity of every loopback address.
LOOPBACK = "loopback"
#: The environment variable the project's clients (``progpo/Remote-v0``, the WebShop env's HTTP backend) read
#: their client token from when none is given.
CLIENT_TOKEN_VAR = "PROGPO_CLIENT_TOKEN"


class UnknownClientToken(Exception):
    """A request's bearer token is not one of the server's client tokens (answered 401)."""


@functools.lru_cache(maxsize=1 << 14)  # the same few addresses over and over: parse each once
def client_host(address: str | None) -> str:
    """The host a source address stands for (see the module docstring); ``"unknown"`` when there is none."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)
    except ValueError:
        return address  # a Unix socket path or another non-IP peer: itself
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class ClientTokens:
    """The operator's client tokens: a request's ``Authorization: Bearer`` header → its client.

    Args:
        tokens: The tokens, in order (a token's client is ``token #<line>``, so no token is ever printed).
    """

    def __init__(self, tokens: Iterable[str]):
        self._tokens = [token for token in tokens]
        if not self._tokens:
            raise ValueError("no client tokens given")
        if any(not token or any(c.isspace() for c in token) for token in self._tokens):
            raise ValueError("a client token may not be empty or hold spaces")

    @classmethod
    def from_file(cls, path: str | Path) -> ClientTokens:
        """The tokens of a file, one per line (blank lines and ``#`` comments skipped)."""
        lines = Path(path).read_text().splitlines()
        return cls(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))

    def __len__(self) -> int:
        return len(self._tokens)

    def identify(self, authorization: str | None, address: str | None) -> str:
        """The client of a request: its token's, or its host's without one (:class:`UnknownClientToken`)."""
        if not authorization:
            return client_host(address)
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise UnknownClientToken("the Authorization header must be 'Bearer <client token>'")
        # compare with every token in constant time, so the answer's timing does not spell a token out
        matches = [hmac.compare_digest(token.encode(), known.encode()) for known in self._tokens]
        if not any(matches):
            raise UnknownClientToken("unknown client token: ask the server's operator for yours")
        return f"token #{matches.index(True) + 1}"


def add_client_tokens_option(parser: argparse.ArgumentParser) -> None:
    """Both servers' ``--client-tokens FILE`` (read with :func:`tokens_of_option`)."""
    parser.add_argument(
        "--client-tokens",
        metavar="FILE",
        help="a file of client tokens, one per line: a request with 'Authorization: Bearer <token>' counts "
        "as that token's client (its own share), an unknown token is refused (401), a request without one "
        "counts as its host",
    )


def tokens_of_option(path: str | None) -> ClientTokens | None:
    """The tokens of ``--client-tokens`` (``None`` when it is not given); a file that cannot be read or holds
    no valid token is a :class:`~progpo_base.usage.UsageError`."""
    if path is None:
        return None
    try:
        return ClientTokens.from_file(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--client-tokens {path}: {exc}") from None


def identify_client(tokens: ClientTokens | None, authorization: str | None, address: str | None) -> str:
    """The client of a request for a server with ``tokens`` (``None``: no tokens; every client is a host).

    A request that sends a token to a server without tokens is counted as its host (the token is ignored).
    """
    if tokens is None:
        return client_host(address)
    return tokens.identify(authorization, address)
