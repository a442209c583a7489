"""Stage 2, planning: topology + profile + instances into a gpunuma.plan/v1 document."""
