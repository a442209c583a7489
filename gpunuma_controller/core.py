"""Import gpunuma's core outside Ansible, the way modules import it.

``module_utils/gpunuma`` is imported as ``ansible.module_utils.gpunuma`` on a
node (Ansible ships it with each module). Scripts, benchmarks and tests run
on the controller call ``use_core()`` once, before their first
``from ansible.module_utils.gpunuma... import``, and get the same package.
"""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(REPO_ROOT, "module_utils")


def use_core():
    """Put the repository's ``module_utils`` on ``ansible.module_utils``'s path; return that directory.

    Needs ansible-core (the repository's virtualenv); raises ImportError
    naming it otherwise.
    """
    try:
        import ansible.module_utils
    except ImportError as exc:
        raise ImportError("gpunuma's core needs ansible-core: run with the virtualenv's python "
                          "(.venv/bin/python; scripts/setup-venv.sh creates it): %s" % exc) from exc
    if MODULE_UTILS not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(MODULE_UTILS)
    return MODULE_UTILS
