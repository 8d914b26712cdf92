"""Stand-ins for the kubelet and the API server, for the demo, the tests and the bench."""
