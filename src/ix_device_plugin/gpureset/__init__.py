"""Resetting GPUs with `ixsmi` around Iluvatar's handshake, for both front ends.

Its machinery is loaded at the first reset (service.py).
"""
