"""Stand-ins for the kubelet and the API server, for the demo, the tests and the bench.

And the one way they wait (waits.py: until an event, or that nothing happens for a period).
"""
