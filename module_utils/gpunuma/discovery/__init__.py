"""Stage 1, discovery: sysfs, NVML and `nvidia-smi topo -m` into a gpunuma.topology/v1 document."""
