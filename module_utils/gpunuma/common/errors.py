"""Exceptions raised by the gpunuma core; modules turn them into fail_json."""


class GpunumaError(Exception):
    """Base class: the message names the input and what was wrong with it."""


class ProblemsError(GpunumaError):
    """Several problems with one input, found in one pass: ``problems`` lists
    each (naming the variable path and what is allowed); the message is one
    problem per line. A single string is one problem."""

    def __init__(self, problems):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


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


class LscpuError(GpunumaError, ValueError):
    """lscpu text that cannot be read as a CPU layout; the message names the line."""
