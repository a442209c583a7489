#!/bin/bash
# Record the H2D probe on a GPU machine: h2d_probe_info through ansible on
# localhost (every GPU, every placement), then benchmarks/h2d_bench.py (probe
# against PyTorch pinned copy_(non_blocking=True)) with both pinned-memory
# modes.  Results go to $OUT (default ./out/h2d-record).  Wheels for ansible
# may be carried in .whl/ when the machine has no ansible.
OUT=${OUT:-out/h2d-record}
mkdir -p "$OUT"
if ! command -v ansible >/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1 ANSIBLE_LOCALHOST_WARNING=0
PY=$(command -v python3)
(date -u; uname -a; nvidia-smi -L; nvidia-smi topo -m
 nvidia-smi --query-gpu=index,uuid,pci.bus_id,pcie.link.gen.max,pcie.link.width.max,compute_mode --format=csv
 numactl -H; cat /sys/devices/system/node/node*/cpulist
 "$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count())'
 ansible --version) > "$OUT/env.txt" 2>&1
t0=$(date +%s)
ansible localhost -i localhost, -c local \
    -m h2d_probe_info -a "{\"output\": \"$OUT/h2d-probe.json\"}" -e ansible_python_interpreter="$PY" \
    > "$OUT/ansible-probe.txt" 2>&1
echo "ansible rc=$? seconds=$(( $(date +%s) - t0 ))" | tee -a "$OUT/env.txt"
if [ ! -s "$OUT/h2d-probe.json" ]; then
    echo "ansible wrote no probe; running the core directly" | tee -a "$OUT/env.txt"
    "$PY" -c "
import json, ansible.module_utils
ansible.module_utils.__path__.append('module_utils')
from ansible.module_utils.gpunuma.verify import h2d
json.dump(h2d.probe({}), open('$OUT/h2d-probe.json', 'w'), indent=1)" 2>&1 | tee -a "$OUT/env.txt"
fi
"$PY" benchmarks/h2d_bench.py --json "$OUT/bench-register.json" 2>&1 | tee "$OUT/bench.txt"
echo "bench register rc=${PIPESTATUS[0]}" | tee -a "$OUT/bench.txt"
"$PY" benchmarks/h2d_bench.py --pinned-alloc host_alloc --json "$OUT/bench-host_alloc.json" 2>&1 | tee -a "$OUT/bench.txt"
echo "bench host_alloc rc=${PIPESTATUS[0]}" | tee -a "$OUT/bench.txt"
"$PY" - "$OUT/h2d-probe.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["status"], d["reason"], d.get("seconds"))
for g in d["gpus"]:
    print(g["index"], g["uuid"], g["pci_bus_id"], g["numa_node"], g["pcie"], g["status"], g["reason"])
    for p, v in g["placements"].items():
        print(" ", p, v["status"], v.get("reason"), v.get("seconds"), v.get("binding"))
        for k, x in v.get("measurement", {}).items():
            print("   ", k, {a: b for a, b in x.items() if a != "seconds"})
PYEOF
