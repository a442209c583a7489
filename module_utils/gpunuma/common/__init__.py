"""Primitives every stage shares: the error type, CPU lists, sizes."""
