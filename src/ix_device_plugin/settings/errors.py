"""The one error of the settings layer."""

from __future__ import annotations


class SettingsError(Exception):
    """Settings that cannot be used; messages holds one line per problem, each naming the flag, the
    environment variable or the file, line and key it came from."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages
