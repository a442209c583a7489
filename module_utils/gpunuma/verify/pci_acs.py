"""The PCI Access Control Services (ACS) control register, read from a bridge's config space.

ACS P2P redirection sends GPU peer traffic up to the root complex (NCCL's troubleshooting guide asks for it off
on bare metal); the node checks name the bits that are set.
"""

from __future__ import annotations

# PCI config space: extended capabilities start at 0x100; ACS is id 0x000d.
_EXT_CAP_START = 0x100
_ACS_CAP_ID = 0x000D
CONFIG_LIMIT = 4096
# ACS control bits (PCIe base spec 7.7.11.3): P2P Request Redirect and
# P2P Completion Redirect send peer TLPs up to the root complex; Egress
# Control can block or redirect them too.
ACS_RR = 0x0004
ACS_CR = 0x0008
ACS_EC = 0x0020
_ACS_BITS = ((0x0001, "SrcValid"), (0x0002, "TransBlk"), (ACS_RR, "ReqRedir"), (ACS_CR, "CmpltRedir"),
             (0x0010, "UpstreamFwd"), (ACS_EC, "EgressCtrl"), (0x0040, "DirectTrans"))


def acs_control_from_config(data):
    """The ACS control register from PCI config space bytes, or ``None`` when absent.

    Raises ``ValueError`` when the extended capability list is malformed.
    Returns ``None`` for config space shorter than 4 KiB (an unprivileged
    reader sees only the first 64 or 256 bytes).
    """
    if len(data) < CONFIG_LIMIT:
        return None
    offset, seen = _EXT_CAP_START, set()
    while offset:
        if offset < _EXT_CAP_START or offset > CONFIG_LIMIT - 8 or offset & 3 or offset in seen:
            raise ValueError("the extended capability list points to offset 0x%x, outside 0x100-0xff8 "
                             "or looping" % offset)
        seen.add(offset)
        header = int.from_bytes(data[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == _ACS_CAP_ID:
            return int.from_bytes(data[offset + 6:offset + 8], "little")
        offset = (header >> 20) & 0xFFC
    return None


def acs_bits(ctrl):
    return [name for bit, name in _ACS_BITS if ctrl & bit]
