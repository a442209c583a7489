"""systemd quoting: the words of ``ExecStart=`` and ``Environment=`` (systemd.syntax).

Commands are argv lists and are never interpreted by a shell; these
functions write each word so that systemd hands it to the program verbatim.
The role's filter plugin imports them (through ``plan``), so the unit files
and the plan agree on every word.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.plan.model import PlanError

# systemd reads these as ExecStart= prefixes even inside quotes, and refuses
# quotes, backslashes and control characters in the executable name.
EXEC_PREFIX_CHARS = "-@:+!|"
_EXEC_NAME_FORBIDDEN = set("\"'\\")


def exec_name_problem(executable):
    """Why ``executable`` cannot be the first word of ``ExecStart=``, or None."""
    if not isinstance(executable, str) or not executable:
        return "the executable must be a non-empty string"
    if executable[0] in EXEC_PREFIX_CHARS:
        return "%r starts with %r, which systemd reads as an ExecStart= prefix even when quoted" % (
            executable,
            executable[0],
        )
    bad = sorted(set(c for c in executable if c in _EXEC_NAME_FORBIDDEN or ord(c) < 0x20 or ord(c) == 0x7F))
    if bad:
        return "%r contains %s, which systemd refuses in an executable name" % (
            executable,
            ", ".join(repr(c) for c in bad),
        )
    return None


def _systemd_word(text, expand_dollar):
    """``text`` as one double-quoted systemd word (systemd.syntax).

    Backslash and double quote are backslash-escaped, control characters use
    C escapes, ``%`` becomes ``%%`` (specifier expansion) and, where systemd
    expands variables (``expand_dollar``), ``$`` becomes ``$$``.
    """
    out = ['"']
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "%":
            out.append("%%")
        elif char == "$" and expand_dollar:
            out.append("$$")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append("\\x%02x" % ord(char))
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def systemd_quote(arg, executable=False):
    """Quote one argument for ``ExecStart=`` (systemd.syntax / systemd.service).

    Except in the executable name (where systemd performs no variable
    expansion), ``$`` becomes ``$$``.
    """
    if not isinstance(arg, str):
        raise PlanError("ExecStart argument %r is not a string; allowed: strings" % (arg,))
    if "\x00" in arg:
        raise PlanError("ExecStart argument %r contains a NUL byte; allowed: text without NUL" % (arg,))
    if executable:
        problem = exec_name_problem(arg)
        if problem:
            raise PlanError("ExecStart executable: %s" % problem)
    return _systemd_word(arg, expand_dollar=not executable)


def systemd_environment_assignment(name, value):
    """One ``Environment=`` word, ``"NAME=value"`` quoted for systemd.

    ``Environment=`` expands specifiers but no ``$`` variables, so ``$`` is
    kept as it is.
    """
    text = "%s=%s" % (name, value)
    if "\x00" in text:
        raise PlanError("Environment %s contains a NUL byte; allowed: text without NUL" % name)
    return _systemd_word(text, expand_dollar=False)


def systemd_exec_line(argv):
    """The value of ``ExecStart=`` that runs ``argv`` verbatim, with no shell.

    Shell metacharacters (``;``, ``|``, ``$HOME``, quotes, spaces) reach the
    program as literal argument text.
    """
    if not isinstance(argv, (list, tuple)) or not argv:
        raise PlanError(
            'ExecStart argv: %r is not a non-empty list of strings; allowed: a list like ["/usr/bin/vllm", "serve"]'
            % (argv,)
        )
    words = [systemd_quote(argv[0], executable=True)]
    words.extend(systemd_quote(arg) for arg in argv[1:])
    return " ".join(words)
