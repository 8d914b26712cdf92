"""The Kubernetes API server: one connection owner, typed calls, watches."""
