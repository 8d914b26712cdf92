"""Log set-up: one line per event, as text or JSON."""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
# Libraries whose own logs (one line per HTTP request, per HTTP/2 frame...) show only at debug.
LIBRARIES = ("httpx", "httpx2", "httpcore", "httpcore2", "lightkube", "grpc", "asyncio", "hpack", "h2", "urllib3")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, plus any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(level: str = "info", fmt: str = "text") -> None:
    """Send the logs to stderr in fmt ("text" or "json") at level; the libraries' own at WARNING unless
    level is debug."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if level.lower() == "debug" else logging.WARNING)


class OncePerError:
    """Logs a failure once per distinct message, and a recovery once after a failure."""

    def __init__(self, logger: logging.Logger, level: int = logging.ERROR) -> None:
        self._logger = logger
        self._level = level
        self.last: str = ""

    @property
    def failing(self) -> bool:
        """True while the last outcome was a failure."""
        return bool(self.last)

    def failed(self, message: str, *args: object) -> bool:
        """Log message % args unless it equals the previous failure; True when it was logged."""
        text = message % args if args else message
        if text == self.last:
            return False
        self.last = text
        self._logger.log(self._level, "%s", text)
        return True

    def succeeded(self, message: str = "", *args: object) -> None:
        """Forget the failure; log message (at INFO) when one was being reported."""
        if self.last and message:
            self._logger.info(message, *args)
        self.last = ""
