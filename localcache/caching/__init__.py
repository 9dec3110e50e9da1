"""Pure rules of the domain, no I/O: keys, placement, credentials, conditions, config."""
