"""Verification: the audit, platform checks, and the host-to-device probe with its report."""
