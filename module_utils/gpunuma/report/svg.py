"""The fleet report's drawings (report/page.py): each host's model for drawing, its topology
picture, link matrices and the legend, as inline SVG."""

from __future__ import annotations

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist as format_ids
from ansible.module_utils.gpunuma.report.base import (
    CROSS_COLOUR, FREE_FILL, HOUSEKEEPING_FILL, LINK_COLOURS, PALETTE, esc, parse_cpulist, shown)
from ansible.module_utils.gpunuma.report.load import _int

# ---------------------------------------------------------------- model for drawing


def _node_sockets(topo):
    """(socket label per node id, whether the grouping is known)."""
    nodes = topo["numa_nodes"]
    cpu_nodes = [n for n in nodes if parse_cpulist(n.get("cpus"), "cpus")]
    pos = {n["id"]: i for i, n in enumerate(nodes)}

    def dist(a, b):
        row = a.get("distances") or []
        j = pos[b["id"]]
        return row[j] if j < len(row) else None

    sockets = topo.get("sockets")
    group = {}
    known = False
    have_dist = all(len(n.get("distances") or []) == len(nodes) for n in nodes) and nodes
    if have_dist and cpu_nodes:
        # CPU-bearing nodes of one package sit at SLIT distance below 20 (remote sockets are 20 or more).
        next_socket = 0
        for node in cpu_nodes:
            for other in cpu_nodes:
                if other["id"] in group and dist(node, other) is not None and dist(node, other) < 20:
                    group[node["id"]] = group[other["id"]]
                    break
            else:
                group[node["id"]] = next_socket
                next_socket += 1
        known = sockets is None or sockets == next_socket
    elif cpu_nodes and sockets == len(cpu_nodes):
        for i, node in enumerate(cpu_nodes):
            group[node["id"]] = i
        known = True
    elif cpu_nodes and sockets == 1:
        for node in cpu_nodes:
            group[node["id"]] = 0
        known = True
    else:
        for i, node in enumerate(cpu_nodes):
            group[node["id"]] = i
    # Memory-only nodes: with the GPU whose memory they are, else the nearest CPU node.
    gpu_mem = {}
    for gpu in topo["gpus"]:
        if _int(gpu.get("gpu_numa_id")) and gpu.get("numa_node") in group:
            gpu_mem[gpu["gpu_numa_id"]] = group[gpu["numa_node"]]
    for node in nodes:
        if node["id"] in group:
            continue
        if node["id"] in gpu_mem:
            group[node["id"]] = gpu_mem[node["id"]]
        elif have_dist and cpu_nodes:
            best = min(cpu_nodes, key=lambda c: (dist(node, c) if dist(node, c) is not None else 1 << 30, c["id"]))
            group[node["id"]] = group[best["id"]]
        else:
            group[node["id"]] = None
    return group, known


def _host_model(host):
    """Everything the picture and the tables need, computed once (may raise; the caller reports it)."""
    topo = host.get("topology")
    plan = host.get("plan")
    model = {"instances": [], "node_of_cpu": {}, "cpus": {}, "hk": {}, "colour": {}, "socket": {}, "sockets_known": False}
    if topo:
        for node in topo["numa_nodes"]:
            cpus = parse_cpulist(node.get("cpus"), "cpus")
            model["cpus"][node["id"]] = cpus
            for cpu in cpus:
                model["node_of_cpu"][cpu] = node["id"]
        model["socket"], model["sockets_known"] = _node_sockets(topo)
    if plan:
        for node, cpus in (plan.get("housekeeping") or {}).items():
            model["hk"][str(node)] = parse_cpulist(cpus, "housekeeping")
        gpu_node = {}
        gpu_mem_node = {}
        if topo:
            for gpu in topo["gpus"]:
                gpu_node[gpu["index"]] = gpu.get("numa_node")
                if _int(gpu.get("gpu_numa_id")):
                    gpu_mem_node[gpu["gpu_numa_id"]] = gpu["index"]
        for i, inst in enumerate(plan["instances"]):
            colour = PALETTE[i % len(PALETTE)] if i < len(PALETTE) else "hsl(%d,65%%,45%%)" % ((i * 137) % 360)
            cpus = parse_cpulist(inst.get("cpus"), "cpus") if inst.get("cpus") is not None else set()
            cpu_nodes = sorted({model["node_of_cpu"][c] for c in cpus if c in model["node_of_cpu"]})
            gpu_nodes = sorted({gpu_node.get(g) for g in inst.get("gpus") or [] if _int(gpu_node.get(g))})
            mem_nodes = sorted(set(inst.get("mem_nodes") or []))
            # A GPU's own memory node (Grace C2C) counts as that GPU's node.
            mem_cmp = sorted({gpu_node.get(gpu_mem_node[m], m) if m in gpu_mem_node else m for m in mem_nodes})
            # Crossing: any of the instance's CPUs or memory on a node other than one of its GPUs' node
            # (a single-GPU instance bound elsewhere, or a multi-GPU instance spanning nodes).
            used = set(cpu_nodes + mem_cmp)
            away = sorted((used | set(gpu_nodes)) - {gpu_nodes[0]}) if gpu_nodes and len(used | set(gpu_nodes)) > 1 else []
            cross = None
            if away:
                sock = model["socket"]
                socks = {sock.get(n) for n in used | set(gpu_nodes)}
                same_socket = model["sockets_known"] and None not in socks and len(socks) == 1
                cross = {"away": away, "gpu_nodes": gpu_nodes, "cpu_nodes": cpu_nodes, "mem_nodes": mem_nodes,
                         "label": "crosses NUMA nodes" if same_socket else "crosses sockets"}
            model["instances"].append({"doc": inst, "colour": colour, "cpus": cpus, "cpu_nodes": cpu_nodes,
                                       "gpu_nodes": gpu_nodes, "mem_nodes": mem_nodes, "cross": cross})
            model["colour"][inst.get("name")] = colour
    return model


# ---------------------------------------------------------------- SVG


def _link_colour(code):
    code = code or "?"
    if code.startswith("NV"):
        return LINK_COLOURS[0][1]
    if code == "SOC":
        code = "SYS"
    for key, colour, _label in LINK_COLOURS:
        if code == key:
            return colour
    return LINK_COLOURS[-1][1]


def _text(x, y, text, size=12, anchor="start", weight="normal", fill="#111", cls=None):
    return ('<text x="%d" y="%d" font-size="%d" text-anchor="%s" font-weight="%s" fill="%s"%s>%s</text>'
            % (x, y, size, anchor, weight, fill, ' class="%s"' % cls if cls else "", esc(text)))


def _gib(value):
    if not _int(value):
        return "memory unknown"
    if value == 0:
        return "no memory online"
    return "%.1f GiB" % (value / float(1 << 30))


def _by_node(devices, model):
    """``({node: [device]}, [device of no known node])`` for GPUs or NICs."""
    placed, unplaced = {}, []
    for dev in devices:
        if _int(dev.get("numa_node")) and dev["numa_node"] in model["cpus"]:
            placed.setdefault(dev["numa_node"], []).append(dev)
        else:
            unplaced.append(dev)
    return placed, unplaced


class _TopologyDrawing:
    """One host's topology picture, drawn band by band; ``parts`` collects the SVG elements."""

    WIDTH = 1160
    PAD = 12

    def __init__(self, host, model):
        self.host, self.model = host, model
        self.topo = host["topology"]
        self.plan = host.get("plan")
        self.gpus_by_node, self.unplaced_gpus = _by_node(self.topo["gpus"], model)
        self.nics_by_node, self.unplaced_nics = _by_node(self.topo.get("nics") or [], model)
        self.gpu_mem_of = {g["gpu_numa_id"]: g for g in self.topo["gpus"] if _int(g.get("gpu_numa_id"))}
        self.gpu_owner, self.mem_owners, self.cpu_owner = {}, {}, {}
        for inst in model["instances"]:
            for g in inst["doc"].get("gpus") or []:
                self.gpu_owner.setdefault(g, inst)
            for m in inst["mem_nodes"]:
                self.mem_owners.setdefault(m, []).append(inst)
            for c in inst["cpus"]:
                self.cpu_owner.setdefault(c, inst)
        self.hk_all = set()
        for cpus in model["hk"].values():
            self.hk_all |= cpus
        self.parts, self.gpu_pos, self.node_box = [], {}, {}

    def svg(self):
        pad, inner = self.PAD, self.WIDTH - 2 * self.PAD
        nodes = sorted(self.topo["numa_nodes"], key=lambda n: n["id"])
        bands = {}
        for node in nodes:
            bands.setdefault(self.model["socket"].get(node["id"]), []).append(node)
        y = pad
        for sock in sorted(bands, key=lambda s: (s is None, s if s is not None else 0)):
            y = self.band(sock, bands[sock], y, inner)
        if self.unplaced_gpus or self.unplaced_nics or not nodes:
            y = self.unplaced(y, inner, bool(nodes))
        self.crossings()
        return ('<svg class="topology" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="100%%" '
                'style="max-width:%dpx" role="img" aria-label="%s">%s</svg>'
                % (self.WIDTH, y + pad, self.WIDTH, esc("topology of %s" % self.host["name"]), "".join(self.parts)))

    def band(self, sock, band_nodes, y, inner):
        """One socket's band, its NUMA nodes wrapped into rows; returns the y below it."""
        pad = self.PAD
        band_top = y
        x, row_h, row_y, right = pad + 8, 0, y + 22, pad + 260
        for node in band_nodes:
            box_w, box_h = self.box_size(node)
            if x + box_w > pad + inner - 8 and x > pad + 8:
                x = pad + 8
                row_y += row_h + 10
                row_h = 0
            self.node(node, x, row_y, box_w, box_h)
            right = max(right, x + box_w + 8)
            x += box_w + 10
            row_h = max(row_h, box_h)
        y = row_y + row_h + 10
        if sock is None:
            label = "nodes of unknown socket"
        elif self.model["sockets_known"]:
            label = "socket %d" % sock
        else:
            label = "socket unknown (NUMA node %s)" % format_ids(n["id"] for n in band_nodes
                                                                 if self.model["cpus"].get(n["id"]))
        self.parts.insert(0, '<rect class="socket" x="%d" y="%d" width="%d" height="%d" rx="10" fill="#f6f8fb" '
                             'stroke="#8899aa" stroke-width="1.5"/>%s'
                          % (pad, band_top, right - pad, y - band_top,
                             _text(pad + 10, band_top + 16, label, 13, weight="bold", fill="#334")))
        return y + 8

    def grid(self, cpus):
        """``(cell, per_row, grid_h)`` of a node's CPU grid."""
        cell = 12 if len(cpus) <= 192 else (8 if len(cpus) <= 640 else 5)
        per_row = max(1, (370 - 16) // cell)
        return cell, per_row, ((len(cpus) + per_row - 1) // per_row) * cell

    def box_size(self, node):
        cpus = self.model["cpus"].get(node["id"], ())
        mem_rows = len(self.mem_owners.get(node["id"], []))
        if not cpus:
            return 132, 58 + 14 * mem_rows
        grid_h = self.grid(cpus)[2]
        dev_rows = ((len(self.gpus_by_node.get(node["id"], [])) + 4) // 5
                    + (len(self.nics_by_node.get(node["id"], [])) + 5) // 6)
        return 370, 40 + grid_h + 20 + 14 * mem_rows + 34 * dev_rows + 8

    def node(self, node, x, row_y, box_w, box_h):
        """One NUMA node's box: its CPUs (or the memory-only label), memory owners, GPUs and NICs."""
        self.node_box[node["id"]] = (x, row_y, box_w, box_h)
        has_cpus = bool(self.model["cpus"].get(node["id"]))
        self.parts.append('<g class="%s" data-node="%d">' % ("node cpu-node" if has_cpus else "node memory-node",
                                                             node["id"]))
        self.parts.append('<rect x="%d" y="%d" width="%d" height="%d" rx="6" fill="%s" stroke="#555" '
                          'stroke-width="1.2"%s/>' % (x, row_y, box_w, box_h, "#ffffff" if has_cpus else "#f3f0ff",
                                                      "" if has_cpus else ' stroke-dasharray="4 3"'))
        ty = self.cpu_node(node, x, row_y, box_w) if has_cpus else self.memory_node(node, x, row_y)
        for inst in self.mem_owners.get(node["id"], []):
            self.parts.append('<rect x="%d" y="%d" width="%d" height="11" fill="%s"/>'
                              % (x + 6, ty + 1, 10, inst["colour"]))
            doc = inst["doc"]
            self.parts.append(_text(x + 20, ty + 10, "memory: %s (%s)" % (doc.get("name"), doc.get("mem_policy")), 10))
            ty += 14
        if has_cpus:
            self.devices(node, x, ty + 6)
        self.parts.append("</g>")

    def cpu_node(self, node, x, row_y, box_w):
        """The heading and CPU grid of a node with CPUs; returns the y below its housekeeping line."""
        parts, cpus = self.parts, sorted(self.model["cpus"].get(node["id"], ()))
        cell, per_row, grid_h = self.grid(cpus)
        parts.append(_text(x + 8, row_y + 16, "NUMA node %d" % node["id"], 13, weight="bold"))
        size = "%s, %d CPUs" % (_gib(node.get("memory_total_bytes")), len(cpus))
        parts.append(_text(x + box_w - 8, row_y + 16, size, 11, anchor="end"))
        parts.append(_text(x + 8, row_y + 31, "CPUs %s" % format_ids(cpus), 10, fill="#444"))
        gy = row_y + 38
        for k, cpu in enumerate(cpus):
            cx = x + 8 + (k % per_row) * cell
            cy = gy + (k // per_row) * cell
            if cpu in self.hk_all:
                fill, title, cls = HOUSEKEEPING_FILL, "housekeeping", "cpu housekeeping"
            elif cpu in self.cpu_owner:
                owner = self.cpu_owner[cpu]
                fill, title, cls = owner["colour"], esc(owner["doc"].get("name")), "cpu"
            else:
                fill, title, cls = FREE_FILL, "free", "cpu"
            parts.append('<rect class="%s" x="%d" y="%d" width="%d" height="%d" fill="%s">'
                         '<title>CPU %d: %s</title></rect>' % (cls, cx, cy, cell - 1, cell - 1, fill, cpu, title))
        ty = gy + grid_h + 14
        hk_here = self.model["hk"].get(str(node["id"]))
        parts.append(_text(x + 8, ty, "housekeeping: %s" % (format_ids(hk_here) if hk_here else
                                                            ("none" if self.plan else "no plan")), 10, fill="#333"))
        return ty + 4

    def memory_node(self, node, x, row_y):
        """The label of a memory-only node (a GPU's memory, e.g. GB200); returns the y below it."""
        self.parts.append(_text(x + 6, row_y + 15, "node %d" % node["id"], 12, weight="bold"))
        self.parts.append(_text(x + 6, row_y + 29, "memory only, no CPUs", 10, fill="#553399"))
        owner_gpu = self.gpu_mem_of.get(node["id"])
        label = ("GPU%d memory" % owner_gpu["index"]) if owner_gpu else _gib(node.get("memory_total_bytes"))
        if owner_gpu and _int(node.get("memory_total_bytes")):
            label += ", " + _gib(node["memory_total_bytes"])
        self.parts.append(_text(x + 6, row_y + 43, label, 10, fill="#333"))
        return row_y + 46

    def devices(self, node, x, ty):
        """A node's GPUs (five a row) and then its NICs (six a row)."""
        gpus = self.gpus_by_node.get(node["id"], [])
        for k, gpu in enumerate(gpus):
            gx = x + 8 + (k % 5) * 71
            gyy = ty + (k // 5) * 34
            self.gpu_pos[gpu["index"]] = (gx + 32, gyy + 13)
            self.parts.append(_gpu_rect(gx, gyy, gpu, self.gpu_owner.get(gpu["index"])))
        ty += ((len(gpus) + 4) // 5) * 34
        for k, nic in enumerate(self.nics_by_node.get(node["id"], [])):
            self.parts.append(_nic_rect(x + 8 + (k % 6) * 59, ty + (k // 6) * 34, nic))

    def unplaced(self, y, inner, any_nodes):
        """The band of GPUs and NICs of no known node (or the note of a topology with no nodes)."""
        pad = self.PAD
        band_top = y
        y += 22
        for k, gpu in enumerate(self.unplaced_gpus):
            gx = pad + 8 + (k % 15) * 71
            gy = y + (k // 15) * 34
            self.gpu_pos[gpu["index"]] = (gx + 32, gy + 13)
            self.parts.append(_gpu_rect(gx, gy, gpu, self.gpu_owner.get(gpu["index"])))
        y += ((len(self.unplaced_gpus) + 14) // 15) * 34
        for k, nic in enumerate(self.unplaced_nics):
            self.parts.append(_nic_rect(pad + 8 + (k % 18) * 59, y + (k // 18) * 34, nic))
        y += ((len(self.unplaced_nics) + 17) // 18) * 34 + 6
        self.parts.append('<rect x="%d" y="%d" width="%d" height="%d" rx="10" fill="none" stroke="#bb7700" '
                          'stroke-dasharray="6 4"/>' % (pad, band_top, inner, y - band_top))
        self.parts.append(_text(pad + 10, band_top + 16, "NUMA node unknown: GPUs and NICs that cannot be placed"
                                if any_nodes else "no NUMA nodes in the topology", 13, weight="bold", fill="#884400"))
        return y + 8

    def crossings(self):
        """Instances whose CPUs or memory are away from their GPUs: a red dashed line from GPU to that node."""
        gpu_node = {gpu["index"]: gpu.get("numa_node") for gpu in self.topo["gpus"]}
        for inst in self.model["instances"]:
            cross = inst["cross"]
            if not cross:
                continue
            labelled = False
            for g in inst["doc"].get("gpus") or []:
                if g not in self.gpu_pos:
                    continue
                for n in sorted(set(inst["cpu_nodes"]) | set(inst["mem_nodes"])):
                    if n == gpu_node.get(g) or self.gpu_mem_of.get(n, {}).get("index") == g or n not in self.node_box:
                        continue
                    bx, by, bw, _bh = self.node_box[n]
                    x1, y1 = self.gpu_pos[g]
                    self.parts.append('<line class="cross" x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" '
                                      'stroke-width="3" stroke-dasharray="8 5"/>'
                                      % (x1, y1, bx + bw // 2, by + 24, CROSS_COLOUR))
                    if not labelled:
                        labelled = True
                        self.parts.append('<text class="cross-label" x="%d" y="%d" font-size="12" font-weight="bold" '
                                          'fill="%s">%s %s</text>' % (x1 + 34, y1 + 4, CROSS_COLOUR,
                                                                      esc(inst["doc"].get("name")),
                                                                      esc(cross["label"])))


def topology_svg(host, model):
    """The host's topology picture: sockets as bands, NUMA nodes wrapped into rows inside them."""
    return _TopologyDrawing(host, model).svg()


def _gpu_rect(x, y, gpu, owner):
    fill = owner["colour"] if owner else "#ffffff"
    text_fill = "#ffffff" if owner else "#111111"
    title = "GPU%s %s%s" % (gpu.get("index"), gpu.get("name") or "", (" - instance %s" % owner["doc"].get("name"))
                            if owner else " - no instance")
    return ('<g class="gpu" data-gpu="%s"><rect x="%d" y="%d" width="64" height="28" rx="4" fill="%s" stroke="#000" '
            'stroke-width="1.5"/><title>%s</title>%s%s</g>'
            % (esc(gpu.get("index")), x, y, fill, esc(title),
               _text(x + 32, y + 12, "GPU%s" % gpu.get("index"), 11, "middle", "bold", text_fill),
               _text(x + 32, y + 24, shown(owner["doc"].get("name"), 10) if owner else "free", 9, "middle",
                     fill=text_fill)))


def _nic_rect(x, y, nic):
    return ('<g class="nic"><rect x="%d" y="%d" width="54" height="26" rx="3" fill="#fff8e0" stroke="#aa8800"/>'
            '<title>%s</title>%s%s</g>'
            % (x, y, esc("NIC %s %s" % (nic.get("name"), " ".join(str(n) for n in nic.get("netdevs") or []))),
               _text(x + 27, y + 11, "NIC", 9, "middle", fill="#775500"),
               _text(x + 27, y + 22, shown(nic.get("name") or "?", 9), 9, "middle", weight="bold")))


def matrix_svg(title, rows, row_labels, col_labels):
    """A link-class matrix (GPU x GPU or GPU x NIC) as coloured cells."""
    if not rows or not col_labels:
        return ""
    cell = 30 if len(col_labels) <= 12 else 22
    left = 64
    top = 64
    width = left + cell * len(col_labels) + 10
    height = top + cell * len(rows) + 10
    parts = [_text(4, 14, title, 12, weight="bold")]
    for j, label in enumerate(col_labels):
        cx = left + j * cell + cell // 2
        parts.append('<text x="%d" y="%d" font-size="10" transform="rotate(-60 %d %d)">%s</text>'
                     % (cx, top - 4, cx, top - 4, esc(shown(label, 12))))
    for i, row in enumerate(rows):
        parts.append(_text(left - 4, top + i * cell + cell // 2 + 4, row_labels[i], 10, "end"))
        for j, code in enumerate(row):
            parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="%s" stroke="#999"><title>%s - %s: %s</title></rect>'
                         % (left + j * cell, top + i * cell, cell, cell, _link_colour(code), esc(row_labels[i]),
                            esc(col_labels[j]), esc(code)))
            parts.append(_text(left + j * cell + cell // 2, top + i * cell + cell // 2 + 4, shown(code, 5),
                               8 if cell < 30 or len(code) > 3 else 10, "middle"))
    return ('<svg class="links" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d">%s</svg>'
            % (width, height, width, height, "".join(parts)))


def legend_html():
    items = "".join('<span class="lg"><i style="background:%s"></i>%s</span>' % (colour, esc(label))
                    for code, colour, label in LINK_COLOURS if code != "X")
    items += ('<span class="lg"><i style="background:%s"></i>housekeeping CPU</span>'
              '<span class="lg"><i style="background:%s"></i>free CPU</span>'
              '<span class="lg"><i style="background:#f3f0ff;border:1px dashed #555"></i>memory-only node</span>'
              '<span class="lg"><i style="background:%s"></i>instance crossing sockets</span>'
              % (HOUSEKEEPING_FILL, FREE_FILL, CROSS_COLOUR))
    return '<div class="legend">%s</div>' % items
