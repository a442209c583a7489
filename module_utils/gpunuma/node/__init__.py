"""Stage 3, the node: one read of its state, the files a plan becomes, and the apply engine."""
