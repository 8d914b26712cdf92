"""Where devices come from: the IXML library on a real node, or a simulation."""
