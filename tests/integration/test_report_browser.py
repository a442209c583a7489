"""The HTML fleet report in Debian's headless Chromium: no console error, every host and
instance in the DOM, and a screenshot of the 8-GPU host whose picture is really drawn.

The artefacts are written by gpunuma's own code (tests/fixtures/report/make_artefacts.py)
and the page by scripts/report.py, as an operator runs it. Chromium is installed by
scripts/setup-host.sh; without /usr/bin/chromium these tests are skipped.
"""

import html.parser
import os
import re
import struct
import subprocess
import sys
import zlib

import pytest

from conftest import FIXTURES, REPO_ROOT

sys.path.insert(0, os.path.join(FIXTURES, "report"))
import make_artefacts  # noqa: E402
from ansible.module_utils.gpunuma.report import base as report_base  # noqa: E402
from ansible.module_utils.gpunuma.report.base import HOUSEKEEPING_FILL, PALETTE  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
SCRIPT = os.path.join(REPO_ROOT, "scripts", "report.py")
WIDTH, HEIGHT = 1280, 1700

pytestmark = [pytest.mark.browser, pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                reason="%s is not installed (scripts/setup-host.sh installs Debian's chromium)"
                                % CHROMIUM)]

CONSOLE_LINE = re.compile(r":CONSOLE[:(]")


def chromium(tmp_path, url, *args):
    """Run headless Chromium on ``url``; (stdout, console lines from its log)."""
    profile = tmp_path / "chromium-profile"
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           "--user-data-dir=%s" % profile, "--enable-logging=stderr", "--v=0",
           "--window-size=%d,%d" % (WIDTH, HEIGHT), "--force-device-scale-factor=1"] + list(args) + [url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, [line for line in proc.stderr.splitlines() if CONSOLE_LINE.search(line)]


def render(tmp_path, *extra):
    root = tmp_path / "artefacts"
    if not root.exists():
        make_artefacts.write_fleet(str(root))
    out = tmp_path / ("report-%d.html" % len(list(tmp_path.glob("report-*.html"))))
    proc = subprocess.run([sys.executable, SCRIPT, str(root), "-o", str(out)] + list(extra),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


class DomIndex(html.parser.HTMLParser):
    """data-host and data-instance attributes of the dumped DOM, and whether an <svg> sits in each host section."""

    def __init__(self):
        super().__init__()
        self.sections = []
        self.instances = {}
        self.svgs = {}
        self._host = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and "data-host" in attrs:
            self._host = attrs["data-host"]
            self.sections.append(self._host)
        elif tag == "tr" and "data-instance" in attrs and self._host:
            self.instances.setdefault(self._host, []).append(attrs["data-instance"])
        elif tag == "svg" and self._host and attrs.get("class") == "topology":
            self.svgs[self._host] = self.svgs.get(self._host, 0) + 1


# ---------------------------------------------------------------- PNG, in pure Python


def read_png(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos = 8
    idat = []
    width = height = channels = None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _comp, _filt, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    prev = bytearray(stride)
    rows = []
    i = 0
    for _ in range(height):
        ftype = raw[i]
        line = bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        if ftype == 1:
            for x in range(channels, stride):
                line[x] = (line[x] + line[x - channels]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:
            for x in range(stride):
                left = line[x - channels] if x >= channels else 0
                line[x] = (line[x] + ((left + prev[x]) >> 1)) & 0xFF
        elif ftype == 4:
            for x in range(stride):
                a = line[x - channels] if x >= channels else 0
                b = prev[x]
                c = prev[x - channels] if x >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else (b if pb <= pc else c))) & 0xFF
        else:
            assert ftype == 0, "PNG filter %d" % ftype
        rows.append(bytes(line))
        prev = line
    pixels = [[tuple(row[x:x + 3]) for x in range(0, stride, channels)] for row in rows]
    return width, height, pixels


def hex_rgb(colour):
    return tuple(int(colour[k:k + 2], 16) for k in (1, 3, 5))


def picture_problems(pixels, instance_colours, min_pixels=900, housekeeping_cells=0):
    """Why a screenshot is not a drawn topology picture ([] when it is): too little drawn, too few colours,
    an instance colour (its CPU cells and GPU boxes) or the housekeeping CPUs' cells missing."""
    counts = {}
    for row in pixels:
        for px in row:
            counts[px] = counts.get(px, 0) + 1
    total = sum(counts.values())
    background = max(counts, key=counts.get)
    problems = []
    drawn = 1 - counts[background] / float(total)
    if drawn < 0.10:
        problems.append("only %.1f%% of the pixels differ from the background %s" % (drawn * 100, background))
    distinct = sum(1 for n in counts.values() if n >= 20)
    if distinct < 40:
        problems.append("only %d colours cover 20 pixels or more" % distinct)
    for name, colour in instance_colours.items():
        got = counts.get(hex_rgb(colour), 0)
        if got < min_pixels:      # a table swatch alone is 14x14 = 196 pixels; CPU cells and GPU boxes are more
            problems.append("instance %s's colour %s covers %d pixels (at least %d expected)" % (name, colour, got,
                                                                                               min_pixels))
    if housekeeping_cells:
        # 11x11 cells; the legend's swatch alone is 14x12 = 168 pixels.
        got = counts.get(hex_rgb(HOUSEKEEPING_FILL), 0)
        if got < 100 * housekeeping_cells:
            problems.append("housekeeping colour covers %d pixels (%d cells of CPUs expected)" % (got, housekeeping_cells))
    return problems


# ---------------------------------------------------------------- tests


def test_no_console_error_and_every_host_and_instance_in_the_dom(tmp_path):
    page = render(tmp_path)
    dom, console = chromium(tmp_path, page.as_uri(), "--dump-dom")
    assert console == []
    index = DomIndex()
    index.feed(dom)
    docs = make_artefacts.fleet()
    assert sorted(index.sections) == sorted(docs)
    for host, kinds in docs.items():
        assert index.instances.get(host) == [i["name"] for i in kinds["plan"]["instances"]], host
        assert index.svgs.get(host) == 1, host


def test_console_check_catches_a_thrown_error(tmp_path):
    """The console check above is not blind: an error thrown by a script in the same page is caught,
    and so is a script the page's Content-Security-Policy refuses."""
    text = render(tmp_path).read_text()
    meta = re.search(r'<meta http-equiv="Content-Security-Policy"[^>]*>', text).group(0)
    thrown = tmp_path / "thrown.html"
    thrown.write_text(text.replace(meta, "").replace("</body>", '<script>throw new Error("gpunuma-injected")</script>'
                                                                 "</body>"))
    _dom, console = chromium(tmp_path, thrown.as_uri(), "--dump-dom")
    assert any("Uncaught Error: gpunuma-injected" in line for line in console), console
    refused = tmp_path / "refused.html"
    refused.write_text(text.replace("</body>", "<script>document.title = 'x'</script></body>"))
    _dom, console = chromium(tmp_path, refused.as_uri(), "--dump-dom")
    assert any("Content Security Policy" in line for line in console), console


def test_screenshot_of_the_8_gpu_host_shows_its_picture(tmp_path):
    page = render(tmp_path, "--host", "gpu-a01")
    shot = tmp_path / "gpu-a01.png"
    _out, console = chromium(tmp_path, page.as_uri(), "--screenshot=%s" % shot)
    assert console == []
    width, height, pixels = read_png(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    plan = make_artefacts.fleet()["gpu-a01"]["plan"]
    colours = {i["name"]: PALETTE[k] for k, i in enumerate(plan["instances"])}
    housekeeping = sum(len(report_base.parse_cpulist(c, "housekeeping")) for c in plan["housekeeping"].values())
    assert housekeeping == 4
    assert picture_problems(pixels, colours, housekeeping_cells=housekeeping) == []

    # The same check fails on the page without its topology picture, and on a blank page.
    text = page.read_text()
    broken = tmp_path / "broken.html"
    broken.write_text(re.sub(r'<svg class="topology".*?</svg>', "", text, flags=re.S))
    _out, _console = chromium(tmp_path, broken.as_uri(), "--screenshot=%s" % shot)
    problems = picture_problems(read_png(shot)[2], colours, housekeeping_cells=housekeeping)
    assert any("instance vllm-0's colour" in p for p in problems), problems
    assert problems[-1].startswith("housekeeping colour covers")
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    _out, _console = chromium(tmp_path, blank.as_uri(), "--screenshot=%s" % shot)
    problems = picture_problems(read_png(shot)[2], colours, housekeeping_cells=housekeeping)
    assert problems[0].startswith("only 0.0% of the pixels differ") and len(problems) == 3 + len(colours)
