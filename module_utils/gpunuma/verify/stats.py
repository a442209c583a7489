"""The statistics behind a validation verdict: per-round medians compared by rank.

The probe measures every placement in several interleaved rounds (A B C,
B C A, ...), so slow drifts of the node (clocks, other tenants, thermal
state) hit every placement alike. Each round gives one figure per metric
(the median bandwidth of its large copies, the p99 of its small copies);
the rounds of two placements are compared with the two-sided Mann-Whitney
U test (Wilcoxon rank-sum), exact null distribution, no normal
approximation: for the 3-20 rounds a validation runs, the exact test is
what the NIST/SEMATECH e-Handbook of Statistical Methods and Hollander,
Wolfe & Chicken, *Nonparametric Statistical Methods* (3rd ed., ch. 4)
prescribe. It assumes nothing about the shape of the distribution, which
for copy latencies is skewed and heavy-tailed.

A difference counts only when it is both significant (p below ``alpha``)
and practically large (the ratio of the medians beyond a tolerance). With
n rounds per placement the smallest attainable two-sided p is
``2 / C(2n, n)``: 3 rounds cannot go below 0.1, so at ``alpha`` 0.05 a
verdict needs at least 4 rounds each (``min_rounds``).
"""

from __future__ import annotations

import math
import statistics

from ansible.module_utils.gpunuma.common.errors import GpunumaError


class StatsError(GpunumaError):
    """Samples that cannot be compared (empty, not numbers)."""


def _check(sample, name):
    if not isinstance(sample, (list, tuple)) or not sample:
        raise StatsError("%s: needs at least one round, got %r" % (name, sample))
    for value in sample:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
            raise StatsError("%s: %r is not a finite number" % (name, value))
    return [float(v) for v in sample]


def _ranks(values):
    """Mid-ranks (1-based) of values, ties sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        rank = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = rank
        i = j + 1
    return ranks


def _u_distribution(n, m):
    """Counts of U = 0..n*m over all C(n+m, n) arrangements without ties (exact null distribution)."""
    # f[i][j][u]: arrangements of i x's and j y's with U = u, built by the last element.
    table = {(0, 0): [1]}
    for i in range(n + 1):
        for j in range(m + 1):
            if i == 0 and j == 0:
                continue
            size = i * j + 1
            counts = [0] * size
            if i > 0:
                # last element is an x: it is greater than all j y's, adding j to U
                prev = table[(i - 1, j)]
                for u, c in enumerate(prev):
                    counts[u + j] += c
            if j > 0:
                prev = table[(i, j - 1)]
                for u, c in enumerate(prev):
                    counts[u] += c
            table[(i, j)] = counts
    return table[(n, m)]


def mann_whitney(x, y):
    """``(U, p)``: the U statistic of x (pairs with x above y, ties half) and its exact two-sided p-value.

    With ties the exact distribution without ties is used on the mid-rank
    statistic, which is conservative for the few ties per-round medians have.
    """
    x, y = _check(x, "first sample"), _check(y, "second sample")
    n, m = len(x), len(y)
    ranks = _ranks(x + y)
    u = sum(ranks[:n]) - n * (n + 1) / 2.0
    counts = _u_distribution(n, m)
    total = float(sum(counts))
    mean = n * m / 2.0
    distance = abs(u - mean)
    # two-sided: arrangements at least as far from the mean as the observed U
    extreme = sum(c for k, c in enumerate(counts) if abs(k - mean) >= distance - 1e-9)
    return u, min(1.0, extreme / total)


def min_p_value(n, m):
    """The smallest two-sided p an exact U test of n and m rounds can reach."""
    return min(1.0, 2.0 / math.comb(n + m, n))


def compare(x, y, higher_is_better, alpha, tolerance):
    """How placement x compares with y on one metric, from their per-round figures.

    Returns a dict: ``outcome`` ``better`` / ``worse`` (significant at
    ``alpha`` and beyond ``tolerance`` relative to y's median) or ``same``;
    ``p``, ``ratio`` (median x / median y), ``median_x``, ``median_y``, the
    round counts, and ``testable`` (False when too few rounds for ``alpha``).
    """
    x, y = _check(x, "first sample"), _check(y, "second sample")
    med_x, med_y = statistics.median(x), statistics.median(y)
    ratio = (med_x / med_y) if med_y else (math.inf if med_x else 1.0)
    testable = min_p_value(len(x), len(y)) < alpha
    _unused, p = mann_whitney(x, y)
    outcome = "same"
    if testable and p < alpha:
        gain = (ratio - 1.0) if higher_is_better else (1.0 - ratio)
        if gain > tolerance:
            outcome = "better"
        elif gain < -tolerance:
            outcome = "worse"
    return {"outcome": outcome, "p": round(p, 6), "ratio": round(ratio, 4), "median_x": round(med_x, 4),
            "median_y": round(med_y, 4), "rounds_x": len(x), "rounds_y": len(y), "testable": testable}


def spread(sample):
    """(max - min) / median of a placement's per-round figures: how much its rounds disagree."""
    values = _check(sample, "sample")
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0
