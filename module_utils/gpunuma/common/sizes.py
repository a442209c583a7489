"""One grammar for sizes: instance ``memory``, instance ``memlock`` and ``memlock_limit``.

Every size in gpunuma is read here, so ``64GiB`` or ``1.5G`` mean the same
in the planner, the memlock role and the limits checks:

* an integer (not a boolean) is a count of bytes;
* a string is a number followed by a unit ``K M G T P E`` (powers of 1024,
  as systemd reads them in ``LimitMEMLOCK=`` and ``MemoryMax=``), optionally
  followed by ``i`` and/or ``B`` (``64G``, ``64GiB``, ``64gb``), or a string
  of digits alone (bytes), optionally followed by ``B``;
* a fraction needs a unit (``1.5G``); the result is rounded down to whole
  bytes, as systemd does. A fraction without a unit (``"1.5"``, ``"1.5B"``)
  is refused: it cannot be a count of bytes, and reading it as 1 byte (what
  a lenient reader does) is never what was meant;
* the result is at most ``MAX_SIZE`` (8 EiB - 1 byte, a signed 64-bit byte
  count: the largest integer every JSON reader and the kernel's ``rlim_t``
  and systemd's ``uint64_t`` all hold). ``99999999999E`` is refused, not
  wrapped or clamped.

Errors are :class:`SizeError` (a ``GpunumaError``) whose message names the
field, shows the value with ``repr`` and says what is allowed.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ansible.module_utils.gpunuma.common.errors import GpunumaError

MAX_SIZE = (1 << 63) - 1
# Longer than any size anyone writes; keeps hostile 400k-digit strings from
# reaching int() (which refuses more than 4300 digits) or Fraction.
MAX_SIZE_TEXT = 64
UNIT_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
SIZE_ALLOWED = "bytes as an integer, or a string like 512M, 32G, 1Ti"

# ASCII only: under re.IGNORECASE without re.ASCII the Kelvin sign matches k.
_SIZE_RE = re.compile(r"[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*([kmgtpe]?)(i?)(b?)[ \t]*", re.IGNORECASE | re.ASCII)


class SizeError(GpunumaError, ValueError):
    """A size could not be read (``out_of_range`` False), or lies above ``MAX_SIZE`` (True)."""

    def __init__(self, message, out_of_range=False):
        super().__init__(message)
        self.out_of_range = out_of_range


def format_gib(count):
    """Bytes as GiB with one decimal, as the planner's capacity messages print them: ``1.5 GiB``."""
    return "%.1f GiB" % (count / float(1 << 30))


def format_size(count):
    """``8 MiB``, ``1.5 GiB``, ``1000 bytes`` for messages (exact where it can be)."""
    for power, unit in ((6, "EiB"), (5, "PiB"), (4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        size = 1024**power
        if count >= size:
            return "%d %s" % (count // size, unit) if count % size == 0 else "%.1f %s" % (count / size, unit)
    return "%d bytes" % count


def _not_a_size(what, value, allowed):
    return SizeError("%s: %r is not a size; allowed: %s" % (what, value, allowed))


def parse_size(value, what="memory", allowed=SIZE_ALLOWED):
    """Bytes (an int from 0 to ``MAX_SIZE``) from an int or a size string.

    ``what`` names the field in the error; ``allowed`` is the "allowed:"
    text for values that are not sizes at all.
    """
    if isinstance(value, bool) or value is None:
        raise _not_a_size(what, value, allowed)
    if isinstance(value, int):
        if value < 0:
            raise SizeError("%s: %d is negative; allowed: 0 or more bytes" % (what, value))
        count = value
    elif isinstance(value, str):
        if len(value) > MAX_SIZE_TEXT:
            raise SizeError(
                "%s: %r... (%d characters) is not a size; allowed: %s"
                % (what, value[:MAX_SIZE_TEXT], len(value), allowed)
            )
        match = _SIZE_RE.fullmatch(value)
        if not match:
            raise _not_a_size(what, value, allowed)
        number, unit, binary = match.group(1), match.group(2).lower(), match.group(3)
        if not unit and binary:
            raise _not_a_size(what, value, allowed)
        if not unit and "." in number:
            raise SizeError(
                "%s: %r has a fraction but no unit, so it is no whole number of bytes; "
                "allowed: bytes as an integer, or a fraction with a unit like 1.5G" % (what, value)
            )
        count = int(Fraction(number) * (1024 ** UNIT_POWERS[unit]))
    else:
        raise _not_a_size(what, value, allowed)
    if count > MAX_SIZE:
        raise SizeError(
            "%s: %r is %s bytes, more than any size gpunuma accepts; allowed: 0 to %d bytes (8 EiB - 1)"
            % (what, value, "{:,}".format(count), MAX_SIZE),
            out_of_range=True,
        )
    return count
