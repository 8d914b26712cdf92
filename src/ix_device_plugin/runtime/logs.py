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


class Repeats:
    """Logs an event's message the first time, then counts its repeats: one summary line (how many, the last at
    what time) per interval instead of one line each. At most `kinds` distinct messages are followed at a time;
    past that, new ones are counted together, so that a storm of distinct events stays a few lines too.
    """

    def __init__(self, logger: logging.Logger, interval: float = 60.0, kinds: int = 64) -> None:
        self._logger = logger
        self.interval = interval
        self.kinds = kinds
        self._tallies: dict[str, _Tally] = {}
        self._overflow = _Tally(logging.INFO, 0.0)

    def log(self, level: int, message: str, *args: object) -> None:
        """Log message % args if it is new, else count it; summaries that are due are logged first."""
        self.flush()
        text = message % args if args else message
        tally = self._tallies.get(text)
        if tally is None and len(self._tallies) < self.kinds:
            self._tallies[text] = _Tally(level, time.monotonic())
            self._logger.log(level, "%s", text)
            return
        counted = tally if tally is not None else self._overflow
        if counted is self._overflow and not counted.count:
            counted.since = time.monotonic()
        counted.count += 1
        counted.level = max(counted.level, level)
        counted.last = time.time()

    def flush(self, force: bool = False) -> None:
        """Log the summaries due (every one when force); forget the messages quiet for a whole interval."""
        now = time.monotonic()
        for text, tally in list(self._tallies.items()):
            if not force and now - tally.since < self.interval:
                continue
            if tally.count:
                elapsed, last = now - tally.since, _clock(tally.last)
                self._logger.log(
                    tally.level, "%s (%d more times in %.0fs, the last at %s)", text, tally.count, elapsed, last
                )
                tally.count, tally.since = 0, now
            else:
                del self._tallies[text]
        overflow = self._overflow
        if overflow.count and (force or now - overflow.since >= self.interval):
            self._logger.log(
                overflow.level,
                "%d more events of other kinds in %.0fs, not logged one by one (the last at %s)",
                overflow.count,
                now - overflow.since,
                _clock(overflow.last),
            )
            overflow.count, overflow.since = 0, now


class _Tally:
    """Repeats of one message since a time."""

    def __init__(self, level: int, since: float) -> None:
        self.level = level
        self.since = since
        self.count = 0
        self.last = 0.0


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall * 1000) % 1000:03d}"
