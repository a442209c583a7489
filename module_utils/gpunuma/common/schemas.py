"""The schema names of gpunuma's versioned documents, defined once.

Every reader and writer names a document's schema through these constants;
the fleet report (``report/base.py``) maps them to the kinds it draws.
"""

TOPOLOGY = "gpunuma.topology/v1"
PLAN = "gpunuma.plan/v1"
STATE = "gpunuma.state/v1"
AUDIT = "gpunuma.audit/v1"
VALIDATION = "gpunuma.validation/v1"
VALIDATION_POLICY = "gpunuma.validation-policy/v1"
H2D_PROBE = "gpunuma.h2d-probe/v1"
NVML_DUMP = "gpunuma.nvml-dump/v1"
LOCK = "gpunuma.lock/v1"
CONVERGED = "gpunuma.converged/v1"

DOCUMENTS = (TOPOLOGY, PLAN, STATE, AUDIT, VALIDATION, VALIDATION_POLICY, H2D_PROBE, NVML_DUMP, LOCK)
