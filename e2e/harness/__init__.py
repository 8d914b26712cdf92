"""The end-to-end harness: a real one-node Kubernetes (built by e2e/cluster/build.sh) and the plugin on it."""
