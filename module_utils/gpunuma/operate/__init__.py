"""Operating a fleet: node state and the rollback ladder, the policy gate, role inputs, metrics."""
