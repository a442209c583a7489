"""gpunuma core: topology discovery, binding plans and policy, without Ansible.

Every module in this package is importable without ansible-core installed
(unit tests import them directly) and uses only the standard library, except
the NVML adapter which imports ``pynvml`` lazily.
"""
