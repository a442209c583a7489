"""Shared pytest setup.

``module_utils/`` is appended to ``ansible.module_utils.__path__`` so unit
tests import the core exactly as modules do at run time
(``ansible.module_utils.gpunuma.*``).
"""

import os
import sys

import ansible.module_utils

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(REPO_ROOT, "module_utils")
if MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(MODULE_UTILS)

FIXTURES = os.path.join(REPO_ROOT, "tests", "fixtures")
sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
