"""Parsers of setting values, each refusing a value with a ValueError that says what was expected.

Each takes (value, from_text) and returns the typed value. from_text is True for flags and environment variables,
whose values are always strings; a config file gives YAML scalars and lists.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

Parser = Callable[[Any, bool], Any]

MIN_INTERVAL, MAX_INTERVAL = 0.1, 3600.0
MAX_REPLICAS = 1024
MAX_RESET_LIMIT = 64  # resets a chip may have within the window: the node-health record keeps that many times
MIN_RESET_WINDOW, MAX_RESET_WINDOW = 1.0, 365 * 86400.0
# Go's strconv.ParseBool (Iluvatar's plugin reads its flags and variables with it) takes t and f too.
_TRUE = frozenset({"true", "yes", "on", "1", "t"})
_FALSE = frozenset({"false", "no", "off", "0", "f"})
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # strconv.ParseBool's, exactly
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")
_RESOURCE_NAME = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def parse_bool(value: Any, from_text: bool = True) -> bool:
    """true/false; as text also yes/no, on/off, 1/0, t/f (any case)."""
    if isinstance(value, bool):
        return value
    if from_text and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError("expected true or false")


def go_bool(value: Any, from_text: bool = True) -> bool:
    """A boolean as Go's strconv.ParseBool reads it, for the spellings of Iluvatar's plugin 4.4.0: exactly GO_TRUE or
    GO_FALSE (no other letter case, no spaces, no yes/no)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in GO_TRUE + GO_FALSE:
        return value in GO_TRUE
    raise ValueError(f"expected true or false as Go's strconv.ParseBool reads them ({' '.join(GO_TRUE + GO_FALSE)})")


def text(value: Any, from_text: bool = True) -> str:
    """Non-empty text without NUL characters."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty value")
    if "\0" in value:
        raise ValueError("expected text without NUL characters")
    return value


def path(value: Any, from_text: bool = True) -> Path:
    """A file or directory path."""
    return Path(text(value))


def path_or_off(value: Any, from_text: bool = True) -> Path | None:
    """A path, or None for `off`."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    return path(value)


def choice(*allowed: str) -> Parser:
    """A parser taking one of allowed (any case), returned in lower case."""

    def parse(value: Any, from_text: bool = True) -> str:
        if not isinstance(value, str) or value.strip().lower() not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value.strip().lower()

    return parse


def seconds(value: Any, from_text: bool = True) -> float:
    """A number of seconds from MIN_INTERVAL to MAX_INTERVAL."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds") from None
    if isinstance(value, bool) or not math.isfinite(number) or not MIN_INTERVAL <= number <= MAX_INTERVAL:
        raise ValueError(f"expected a number of seconds from {MIN_INTERVAL:g} to {MAX_INTERVAL:g}")
    return number


def reset_window(value: Any, from_text: bool = True) -> float:
    """The reset limit's window: a number of seconds from MIN_RESET_WINDOW to MAX_RESET_WINDOW (a year)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds") from None
    if isinstance(value, bool) or not math.isfinite(number) or not MIN_RESET_WINDOW <= number <= MAX_RESET_WINDOW:
        raise ValueError(f"expected a number of seconds from {MIN_RESET_WINDOW:g} to {MAX_RESET_WINDOW:g} (a year)")
    return number


def reset_limit(value: Any, from_text: bool = True) -> int:
    """Resets of a chip within the window before it is left to an operator: 0 (no limit) to MAX_RESET_LIMIT; as
    text, digits."""
    if from_text and isinstance(value, str):
        digits = value.strip()
        if digits.lstrip("-").isascii() and digits.lstrip("-").isdigit() and len(digits) <= 12:
            value = int(digits)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RESET_LIMIT:
        raise ValueError(f"expected a whole number from 0 (no limit) to {MAX_RESET_LIMIT}")
    return value


def seconds_or_off(value: Any, from_text: bool = True) -> float | None:
    """Seconds, or None for `off`."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    return seconds(value)


def parse_address(address: str) -> tuple[str | None, int] | None:
    """(host, port) for `HOST:PORT` or `:PORT`; None for `off`. Raises ValueError when malformed."""
    if address.strip().lower() in {"off", "none", ""}:
        return None
    host, sep, port_text = address.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ValueError("expected HOST:PORT, :PORT or off, with a port from 0 to 65535")
    host = host.strip("[]")
    return (host or None, int(port_text))


def address(value: Any, from_text: bool = True) -> str:
    """An address to listen on, as parse_address reads it."""
    parse_address(text(value))
    return value


def whole_number(low: int, high: int) -> Parser:
    """A parser taking a whole number from low to high (as text: digits only)."""

    def parse(value: Any, from_text: bool = True) -> int:
        if from_text and isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            value = int(value.strip()) if len(value.strip()) <= 12 else high + 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return value

    return parse


def replicas(value: Any, from_text: bool) -> int:
    """Time-slicing replicas per GPU: 0 to MAX_REPLICAS; in a file also a whole number written as a float (2.0),
    which Iluvatar's plugin 4.4.0 takes (its YAML goes through JSON, where 2.0 is 2)."""
    if not from_text and isinstance(value, float) and value.is_integer():
        value = int(value)
    if from_text and isinstance(value, str):
        digits = value.strip()
        if digits.lstrip("-").isascii() and digits.lstrip("-").isdigit() and len(digits) <= 12:
            value = int(digits)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("expected a whole number >= 0")
    if value < 0:
        raise ValueError("expected a whole number >= 0 (0 or 1 means no sharing)")
    if value > MAX_REPLICAS:
        raise ValueError(f"expected at most {MAX_REPLICAS} replicas per GPU")
    return value


def resource_name(value: Any, from_text: bool = False) -> str:
    """An extended resource name `<domain>/<name>` outside the kubernetes.io domain."""
    if not isinstance(value, str) or not _RESOURCE_NAME.match(value):
        raise ValueError("expected an extended resource name <domain>/<name>, such as iluvatar.com/gpu")
    domain = value.split("/", 1)[0]
    if domain in {"kubernetes.io", "k8s.io"} or domain.endswith(".kubernetes.io"):
        raise ValueError("expected an extended resource name outside the kubernetes.io domain")
    return value


_POD_UID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?$")


def pod_uid(value: Any, from_text: bool = True) -> str:
    """A pod UID as the downward API gives it (lower-case letters, digits and dashes), safe in a file name."""
    if not isinstance(value, str) or not _POD_UID.match(value.strip()):
        raise ValueError("expected a pod UID such as 3f9a2c1e-7b4d-4c6e-9a1b-2d3e4f5a6b7c")
    return value.strip()


FIELD_MANAGER_LIMIT = 128  # the API server's limit on a field manager's name


def field_manager(value: Any, from_text: bool = True) -> str:
    """A field manager's name as the API server takes it: 1 to 128 printable characters."""
    if not isinstance(value, str) or not value or not value.isprintable() or len(value) > FIELD_MANAGER_LIMIT:
        raise ValueError(f"expected a field manager's name: 1 to {FIELD_MANAGER_LIMIT} printable characters")
    return value


MAX_COMMAND_ARGS, MAX_ARG_CHARS = 64, 4096


def command(value: Any, from_text: bool = True) -> tuple[str, ...]:
    """A command to run without a shell: a YAML list of arguments, or as text split as a shell would split it (its
    quotes, nothing else); the program an absolute path. `off` or empty: none."""
    import shlex

    if isinstance(value, str):
        if value.strip().lower() in {"", "off"}:
            return ()
        try:
            value = shlex.split(value)
        except ValueError as error:
            raise ValueError(f"expected a command line ({error})") from None
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise ValueError("expected a command: a list of arguments, the first an absolute path")
    if not value:
        return ()
    if len(value) > MAX_COMMAND_ARGS or any(len(arg) > MAX_ARG_CHARS or "\0" in arg for arg in value):
        raise ValueError(f"expected at most {MAX_COMMAND_ARGS} arguments of at most {MAX_ARG_CHARS} characters")
    if not value[0].startswith("/"):
        raise ValueError(f"expected the program as an absolute path (no shell, no PATH lookup), got {value[0]!r}")
    return tuple(value)
