"""The policy gate: rules kept as data (policies/), judged against a plan before anything changes."""
