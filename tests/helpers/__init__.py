"""Modules shared by the tests: fixtures' parts, stand-in drivers, and the one way to wait on an event."""
