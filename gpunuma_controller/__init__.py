"""gpunuma on the controller: code that never runs on a node.

* ``core.use_core()``: the one way scripts, benchmarks and tests import the
  core (``module_utils/gpunuma``) as ``ansible.module_utils.gpunuma``, exactly
  as modules shipped to a node import it. Ansible's own plugins get the
  configured ``module_utils`` path instead (``filter_plugins/gpunuma.py``).
"""
