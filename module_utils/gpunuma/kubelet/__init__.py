"""Kubernetes nodes: KubeletConfiguration settings for a plan and profile."""
