"""A run on the controller: role inputs, the converge record, the persisted topology copies."""
