"""Read and write a KubeletConfiguration file without disturbing what gpunuma does not own.

A kubelet config is YAML (kubeadm's ``/var/lib/kubelet/config.yaml``,
Kubespray's ``kubelet-config.yaml``, hand-edited files with comments) or JSON
(EKS's ``/etc/kubernetes/kubelet/config.json``). :func:`parse_config` keeps
the format, and :func:`dump_config` writes the document back in it:

* YAML goes through ruamel.yaml's round-trip loader, because PyYAML drops
  comments and cannot keep the layout of the keys gpunuma leaves alone; the
  indentation of the file is detected and reused, so an unrelated key's line
  is written back as it was.
* JSON keeps key order (``json`` preserves it) and the file's indentation.

Only the standard library is needed for JSON; ruamel.yaml is needed for YAML
where this code runs (the controller, when the ``kubelet_topology`` role runs
the planner there; see docs/kubelet.md).
"""

from __future__ import annotations

import io
import json
import re

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.errors import GpunumaError

# What ruamel raises on a document it cannot read (Exception where ruamel is missing: nothing is parsed then).
_RUAMEL_ERRORS: tuple = (Exception,)
try:  # pragma: no cover - exercised through the import guard below
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    _RUAMEL_ERRORS = (YAMLError,)
    HAS_RUAMEL = True
except ImportError:  # pragma: no cover
    HAS_RUAMEL = False

KIND = "KubeletConfiguration"
API_VERSIONS = ("kubelet.config.k8s.io/v1beta1",)
FORMATS = ("yaml", "json")
_JSON_INDENT_RE = re.compile(r"^\{\s*\n([ \t]+)\"", re.MULTILINE)


_NOT_JSON = object()


def _unique_pairs(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise KubeletConfigError("key %r appears twice in one JSON object" % key)
        seen[key] = value
    return seen


class KubeletConfigError(GpunumaError):
    """The existing kubelet config cannot be read or is not a KubeletConfiguration."""


class ParsedConfig(object):
    """The document (a mutable mapping in its library's type) and how to write it back."""

    __slots__ = ("doc", "fmt", "text", "indent", "seq_indent")

    def __init__(self, doc, fmt, text, indent=2, seq_indent=0):
        self.doc = doc
        self.fmt = fmt
        self.text = text
        self.indent = indent
        self.seq_indent = seq_indent


def _yaml(indent=2, seq_indent=0):
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    # seq_indent is how far a block sequence's dash sits right of its parent
    # key; the item's content starts two columns after the dash.
    yaml.indent(mapping=indent, sequence=seq_indent + 2, offset=seq_indent)
    return yaml


def parse_config(text, source="config"):
    """Parse ``text`` (YAML or JSON) into a :class:`ParsedConfig`; check kind and apiVersion."""
    if not isinstance(text, str):
        raise KubeletConfigError("%s: is %s, not text; allowed: a KubeletConfiguration as YAML or JSON text"
                                 % (source, type(text).__name__))
    if not text.strip():
        raise KubeletConfigError(
            "%s: is empty; allowed: an existing KubeletConfiguration (kind: %s, apiVersion: %s)"
            % (source, KIND, API_VERSIONS[0])
        )
    doc = _NOT_JSON
    json_error = None
    if text.lstrip().startswith("{"):
        try:
            doc = bounded.loads_json(text, object_pairs_hook=_unique_pairs)
        except KubeletConfigError as exc:
            raise KubeletConfigError("%s: %s; allowed: each key once" % (source, exc))
        except ValueError as exc:
            # A YAML flow mapping also starts with "{"; read it as YAML below.
            json_error = exc
            if not HAS_RUAMEL:
                raise KubeletConfigError("%s: is not valid JSON (%s); allowed: a KubeletConfiguration as YAML or JSON"
                                         % (source, exc))
    if doc is not _NOT_JSON:
        match = _JSON_INDENT_RE.search(text)
        parsed = ParsedConfig(doc, "json", text, indent=len(match.group(1).expandtabs(4)) if match else 2)
    else:
        if not HAS_RUAMEL:
            raise KubeletConfigError(
                "%s: is YAML, and reading it without losing its comments needs the Python package ruamel.yaml, "
                "which is not installed where this runs; allowed: install ruamel.yaml there (requirements.txt pins "
                "it for the controller), or a JSON config" % source
            )
        try:
            if bounded.json_depth(text, stop_at=bounded.MAX_JSON_DEPTH) > bounded.MAX_JSON_DEPTH:
                raise ValueError("flow collections nested deeper than %d levels" % bounded.MAX_JSON_DEPTH)
            documents = list(_yaml().load_all(text))
        except RecursionError:
            raise KubeletConfigError("%s: is nested too deep to be a KubeletConfiguration; allowed: one "
                                     "KubeletConfiguration document" % source)
        except _RUAMEL_ERRORS + (ValueError,) as exc:
            if json_error is not None:
                raise KubeletConfigError("%s: is not valid JSON (%s) nor a YAML flow mapping; allowed: a "
                                         "KubeletConfiguration as YAML or JSON" % (source, json_error))
            first = str(exc).strip().splitlines()
            raise KubeletConfigError(
                "%s: is not valid YAML (%s); allowed: one KubeletConfiguration document"
                % (source, " ".join(line.strip() for line in first[:6]))
            )
        documents = [d for d in documents if d is not None]
        if len(documents) != 1:
            raise KubeletConfigError(
                "%s: holds %d YAML documents; allowed: exactly one KubeletConfiguration document"
                % (source, len(documents))
            )
        doc = documents[0]
        indent, seq_indent = _guess_indent(text)
        parsed = ParsedConfig(doc, "yaml", text, indent=indent, seq_indent=seq_indent)
    _check_kind(parsed.doc, source)
    return parsed


def _guess_indent(text):
    """(mapping indent, dash offset of block sequences) as the file writes them; (2, 0) when unknown."""
    indent = seq_indent = None
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for line, following in zip(lines, lines[1:]):
        body = line.split(" #")[0].rstrip()
        if not body.endswith(":"):
            continue
        here = len(line) - len(line.lstrip(" "))
        there = len(following) - len(following.lstrip(" "))
        if following.lstrip().startswith("- "):
            if seq_indent is None and there >= here:
                seq_indent = there - here
        elif indent is None and there > here:
            indent = there - here
        if indent is not None and seq_indent is not None:
            break
    return indent or 2, seq_indent or 0


def _check_kind(doc, source):
    if not isinstance(doc, dict):
        raise KubeletConfigError(
            "%s: is a %s, not a mapping; allowed: a KubeletConfiguration mapping (kind: %s)"
            % (source, type(doc).__name__ if doc is not None else "null", KIND)
        )
    problems = []
    if doc.get("kind") != KIND:
        problems.append("%s: kind is %r; allowed: %s" % (source, doc.get("kind"), KIND))
    if doc.get("apiVersion") not in API_VERSIONS:
        problems.append("%s: apiVersion is %r; allowed: %s" % (source, doc.get("apiVersion"), ", ".join(API_VERSIONS)))
    if problems:
        raise KubeletConfigError("\n".join(problems))


_TOP_KEY_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*:(?:[ \t]|$)")
_SIMPLE_LINE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*[ \t]*:[ \t]*([A-Za-z0-9_.,\-]+|'[^'#]*'|\"[^\"#]*\")([ \t]+#.*)?$")


def _blocks(lines):
    """Top-level key -> (first line, end line) of a block mapping, or None when the layout is not that simple."""
    blocks = {}
    current = None
    for pos, line in enumerate(lines):
        # Indented lines, and block sequence items at column 0 (kubeadm's style), continue the block.
        if not line.strip() or line.startswith((" ", "\t")) or line.rstrip() == "-" or line.startswith("- "):
            continue
        if line.startswith("#") or line.rstrip() in ("---", "..."):
            if current is not None:
                blocks[current] = (blocks[current][0], pos)
                current = None
            continue
        match = _TOP_KEY_RE.match(line)
        if not match or match.group(1) in blocks:
            return None
        if current is not None:
            blocks[current] = (blocks[current][0], pos)
        current = match.group(1)
        blocks[current] = (pos, len(lines))
    # A block ends before the blank lines and comments that follow it.
    out = {}
    for key, (start, end) in blocks.items():
        while end - 1 > start and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
            end -= 1
        out[key] = (start, end)
    return out


def _render_key(parsed, key, value):
    stream = io.StringIO()
    _yaml(parsed.indent, parsed.seq_indent).dump({key: value}, stream)
    return stream.getvalue().splitlines()


def _splice(parsed, keys):
    """The original text with only the blocks of ``keys`` replaced, removed or appended; None if not possible."""
    lines = parsed.text.splitlines()
    blocks = _blocks(lines)
    if blocks is None:
        return None
    edits = []
    appended = []
    for key in keys:
        if key in parsed.doc:
            new_lines = _render_key(parsed, key, parsed.doc[key])
        else:
            new_lines = []
        if key in blocks:
            start, end = blocks[key]
            if end - start == 1 and len(new_lines) == 1:
                # Keep a comment on the line of a simple scalar, with its spacing.
                old = _SIMPLE_LINE_RE.match(lines[start])
                if old and old.group(2):
                    new_lines = [new_lines[0] + old.group(2)]
            edits.append((start, end, new_lines))
        else:
            appended.extend(new_lines)
    for start, end, new_lines in sorted(edits, reverse=True):
        lines[start:end] = new_lines
    if appended:
        tail = len(lines)
        while tail and lines[tail - 1].rstrip() == "...":
            tail -= 1
        lines[tail:tail] = appended
    return "\n".join(lines) + "\n"


def dump_config(parsed, keys=None):
    """The document as text in its original format and indentation.

    For YAML with ``keys`` (the top-level keys that changed), only those
    keys' lines are rewritten and every other line is kept byte for byte,
    provided the result reads back as the same document; otherwise the whole
    document is written by ruamel.yaml's round trip.
    """
    if parsed.fmt == "json":
        text = json.dumps(parsed.doc, indent=parsed.indent, separators=(",", ": "))
        return text + ("\n" if parsed.text.endswith("\n") or not parsed.text else "")
    if keys:
        spliced = _splice(parsed, keys)
        if spliced is not None:
            try:
                again = [d for d in _yaml().load_all(spliced) if d is not None]
            except _RUAMEL_ERRORS + (ValueError,):
                again = None
            if again and len(again) == 1 and plain(again[0]) == plain(parsed.doc):
                return spliced
    stream = io.StringIO()
    _yaml(parsed.indent, parsed.seq_indent).dump(parsed.doc, stream)
    out = stream.getvalue()
    if parsed.text.lstrip().startswith("---") and not out.startswith("---"):
        out = "---\n" + out
    return out


def plain(value):
    """A deep copy of ``value`` as plain dict/list/str/int/float/bool/None (for results and comparisons)."""
    if isinstance(value, dict):
        return dict((str(k), plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)
