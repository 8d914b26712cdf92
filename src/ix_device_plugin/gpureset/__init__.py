"""Resetting GPUs with `ixsmi` around Iluvatar's handshake, for both front ends."""
