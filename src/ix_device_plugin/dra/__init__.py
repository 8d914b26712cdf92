"""The DRA front end: driver gpu.iluvatar.com, its claims, checkpoint and ResourceSlices."""
