"""Exceptions raised by the gpunuma core; modules turn them into fail_json."""


class GpunumaError(Exception):
    """Base class: the message names the input and what was wrong with it."""


class CpuListError(GpunumaError, ValueError):
    """A CPU list, hex cpumask or affinity word list could not be parsed."""


class TopoParseError(GpunumaError):
    """An ``nvidia-smi topo -m`` text could not be parsed."""


class SysfsError(GpunumaError):
    """A sysfs/procfs tree is missing or holds unreadable or malformed files."""


class NvmlError(GpunumaError):
    """NVML (live or replayed) failed or returned data that cannot be used."""


class TopologyError(GpunumaError):
    """The sources disagree or cannot be combined into a topology."""
