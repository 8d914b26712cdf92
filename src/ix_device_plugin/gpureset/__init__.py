"""Resetting GPUs with `ixsmi` around Iluvatar's handshake, for both front ends; its machinery is loaded at the
first reset (service.py)."""
