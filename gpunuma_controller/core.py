"""Import gpunuma's core outside Ansible, the way modules import it.

``module_utils/gpunuma`` is imported as ``ansible.module_utils.gpunuma`` on a
node (Ansible ships it with each module). Scripts, benchmarks and tests run
on the controller call ``use_core()`` once, before their first
``from ansible.module_utils.gpunuma... import``, and get the same package.
"""

import os
import sys
import types

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(REPO_ROOT, "module_utils")


def use_core(standalone=False):
    """Put the repository's ``module_utils`` on ``ansible.module_utils``'s path; return that directory.

    Needs ansible-core (the repository's virtualenv); raises ImportError
    naming it otherwise. With ``standalone`` (scripts run on a GPU machine
    without Ansible: the probe core needs only the standard library and
    libcuda), an ``ansible.module_utils`` package holding only the
    repository's ``module_utils`` stands in when ansible-core is missing.
    """
    try:
        import ansible.module_utils
    except ImportError as exc:
        if not standalone:
            raise ImportError("gpunuma's core needs ansible-core: run with the virtualenv's python "
                              "(.venv/bin/python; scripts/setup-venv.sh creates it): %s" % exc) from exc
        package = types.ModuleType("ansible")
        package.__path__ = []
        module_utils = types.ModuleType("ansible.module_utils")
        module_utils.__path__ = [MODULE_UTILS]
        package.module_utils = module_utils
        sys.modules["ansible"], sys.modules["ansible.module_utils"] = package, module_utils
        return MODULE_UTILS
    if MODULE_UTILS not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(MODULE_UTILS)
    return MODULE_UTILS
