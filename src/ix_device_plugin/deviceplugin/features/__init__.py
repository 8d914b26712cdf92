"""Features behind Allocate's hook: GPU reset and Volcano mode."""
