"""The hardware: the backend seam, its deadlined worker, the IXML and simulated backends, the monitor."""
