"""The HTML fleet report from the JSON artefacts gpunuma writes (standard library only).

``page`` (the page and a summary per host), ``base`` (schemas, limits, colours, escaping, CPU lists),
``load`` (loading, shape checks), ``svg`` (the drawings). The gpunuma_report module and scripts/report.py
call ``page.build_report``.
"""
