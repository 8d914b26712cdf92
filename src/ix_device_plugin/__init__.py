"""Kubernetes device plugin for Iluvatar CoreX GPUs."""

__version__ = "0.1.0"
