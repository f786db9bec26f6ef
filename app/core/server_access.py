"""Who may talk to the API server, as rules without a web framework (the gate, `gate.py`, applies them; config.toml
and the `serve` flags are checked with them): the Host names a request may give, the browser origins it may come
from, and the API key's characters.

- Host: a loopback name or address (localhost, 127.0.0.1, [::1]) with any port, the address it listens on, the
  names the user adds; when it listens on every address (0.0.0.0, ::), any IP address and this machine's name too.
  A page whose name was rebound to this machine (DNS rebinding) gives its own name, so it is refused.
- Origin: only the origins the user allows (`--cors`, `*` for any); a request without one is not from a browser.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9_])?", re.ASCII)  # a DNS name as Host headers give it
_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(:[0-9]{1,5})?", re.ASCII)
ANY = "*"


def split_names(text: str) -> tuple[str, ...]:
    """The names in a config value: separated by commas or spaces."""
    return tuple(part for part in re.split(r"[\s,]+", text) if part)


def host_refusal(name: str) -> str | None:
    """Why `name` cannot be an allowed Host name (one line), or None: a DNS name, an IP address or `*`."""
    if name == ANY or _address(name) is not None or _NAME.fullmatch(name.lower()):
        return None
    return f"{name[:60]!r} is not a host name (letters, digits, dots, hyphens; or an IP address; * for any)"


def origin_refusal(origin: str) -> str | None:
    """Why `origin` cannot be an allowed browser origin (one line), or None: scheme://host[:port], or `*`."""
    if origin == ANY or _ORIGIN.fullmatch(origin.lower()):
        return None
    return f"{origin[:60]!r} is not an origin such as http://localhost:3000 (scheme://host[:port]; * for any)"


def api_key_refusal(key: str) -> str | None:
    """Why `key` cannot be an API key (one line), or None. Clients send it in a header, which carries printable
    ASCII only: a key with another character could never match, and every client would be locked out."""
    bad = next((c for c in key if not ("!" <= c <= "~")), None)
    if bad is None:
        return None
    return (
        f"the API key holds {'a space' if bad == ' ' else f'the character U+{ord(bad):04X}'}: "
        "a key is printable ASCII (letters, digits, punctuation), as HTTP headers carry it"
    )


def host_name(header: str) -> str | None:
    """The name in a Host header ("name:port", "[v6]:port"), lower-case and without a final dot; None if none."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        name, rest = header[1:end], header[end + 1 :]
        if end < 0 or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
    else:
        name, _, port = header.partition(":")
        if port and not port.isdigit():
            return None
    return name.removesuffix(".") or None


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Access:
    """The server's rules: the address it listens on, the Host names and browser origins the user added, and what
    a refusal tells the user to do (a flag of `serve`, a field of F3)."""

    listen_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    cors: tuple[str, ...] = ()
    host_hint: str = "add the name with --allowed-host NAME"
    origin_hint: str = "allow the page's origin with --cors ORIGIN"

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request with this Host header is answered (no header: HTTP/1.0, not a browser)."""
        if header is None:
            return True
        name = host_name(header)
        if name is None:
            return False
        address = _address(name)
        if address is not None and address.is_loopback:
            return True
        allowed = {h.lower().strip("[]").removesuffix(".") for h in self.allowed_hosts}
        if name in LOOPBACK_NAMES or name in allowed or ANY in allowed:
            return True
        listen = self.listen_host.lower().strip("[]")
        if name == listen:
            return True
        if listen in _WILDCARDS or not loopback(listen):
            if listen in _WILDCARDS and address is not None:
                return True  # any of this machine's addresses; an address cannot be rebound
            return name == socket.gethostname().lower()
        return False

    def origin_allowed(self, origin: str | None) -> bool:
        """Whether a request with this Origin header runs (no header: not a browser's)."""
        if origin is None:
            return True
        allowed = self.origins
        return ANY in allowed or origin.lower() in allowed

    @property
    def origins(self) -> tuple[str, ...]:
        """The allowed origins as browsers write them (lower case, no final slash)."""
        return tuple(o.lower().rstrip("/") for o in self.cors)


def loopback(host: str) -> bool:
    """Whether `host` (an address to listen on, a name) is this machine only (no key needed to keep others out)."""
    address = _address(host)
    return host.lower() in LOOPBACK_NAMES or (address is not None and address.is_loopback)
