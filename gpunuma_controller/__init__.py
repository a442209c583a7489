"""gpunuma on the controller: code that never runs on a node.

* ``core.use_core()``: the one way scripts, benchmarks and tests import the
  core (``module_utils/gpunuma``) as ``ansible.module_utils.gpunuma``, exactly
  as modules shipped to a node import it. Ansible's own plugins get the
  configured ``module_utils`` path instead (``filter_plugins/gpunuma.py``).
* ``report``: the HTML fleet report (standard library only; ``scripts/report.py``), with its parts
  ``report_base`` (schemas, limits, colours, escaping, CPU lists), ``report_load`` (loading, shape checks) and
  ``report_svg`` (the drawings).
"""
