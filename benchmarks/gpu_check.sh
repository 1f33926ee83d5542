#!/usr/bin/env bash
# The GPU check: what a session lent a GPU machine runs there, prepared so that its 15 minutes
# of device time (machine start included) measure what docs/performance.md, "What the next GPU
# run must measure", asks for.
#
#   benchmarks/gpu_check.sh prepare   # here (network): wheels the machine lacks -> .whl/
#   benchmarks/gpu_check.sh run       # on the GPU machine, from the repository root
#
# The device tool's call, after `prepare` (one call, nothing else on the machine first):
#
#   run(command="bash benchmarks/gpu_check.sh run", carry=[".whl"], timeout_s=540)
#
# `run` ends by itself within GPU_CHECK_BUDGET seconds (default 450) plus ~15 s: each step
# runs under `timeout` with what is left of the budget, a step that fails or hangs is logged
# and the next one runs, and a step with under 20 s left is skipped. What comes back in $OUT
# (./gpu-check-out/ when OUT is unset): run.log (everything printed), card.txt (the card,
# driver, versions, pip list), gpu.jsonl (bench_gpu.py's JSON lines, each step between two
# {"gpu_check_step": ...} lines), simulate.log (the scans simulated in the background),
# summary.txt (one line per step: rc and seconds) and ncu.tgz (Nsight Compute's CSVs of the
# profiled iterations: kernel times and DRAM bytes; benchmarks/profile_gpu.py --summarize).
#
# Order (the must-have figures first): pytest -m gpu (the fused kernels against the array
# code) while the big scans are simulated in background processes (10000 x 256² takes ~70 s
# of one core); far field rPIE and LSQ-ML at 4000 x 128²; thick samples (issue 34): 1, 2, 3
# and 6 layers side by side at 4000 x 128² (timing: the thin scan's frames), 3 layers from the
# exact thick scan (scored per layer), the cross-package case 16384 x 128² x 6 probe modes x
# 6 layers at batch 1024 (LSQ-ML, rPIE; timing only), one 3-layer LSQ-ML iteration under ncu
# and Pty-Chi's LSQ-ML on the cross-package case; one iteration kernel by kernel
# under ncu (when it is there): rPIE, LSQ-ML, ePIE's first 400 kernels at 4000 x 128² and
# LSQ-ML at 10000 x 256², batch 512; the host's side under cProfile (ePIE, rPIE; near-field
# ePIE); rPIE and LSQ-ML at 10000 x 256² (timed, not scored: scoring costs a core ~70 s);
# both sizes at --batch 512 and 256 (timed); the NRMSE of rPIE and LSQ-ML at 4000 x 128²
# after 100 iterations at the default batch and 256, and after 200 at 512; ePIE and DM far
# field; near field (rPIE, LSQ-ML, DM at 4000 x 128², ePIE at 400 x 64²: one position a
# batch); Pty-Chi (rPIE, LSQ-ML) at 4000 x 128², then rPIE at 10000 x 256².
#
# Environment (for `prepare`): PYVER (default 3.12, the machine's; another only to test
# `run` here), GPU_CHECK_WHEELS (default .whl). For `run`: GPU_CHECK_BUDGET (seconds),
# GPU_CHECK_SITE (default /tmp/site), GPU_CHECK_SCANS (the scan cache, default
# /tmp/gpu-check-scans), and, only to test the script without a card, GPU_CHECK_DEVICE=cpu
# (bench_gpu.py --device cpu; the GPU tests skip) and GPU_CHECK_QUICK=1 (every case 400 x 64²,
# 2 iterations). GPU_CHECK_ONLY="pytest far ncu quality qbatch qbig qnear near ptychi" (any
# of these words, a step's name's first word; also "nographs", "ncubig", "ncub128", "host",
# "thick", "xpkg", "ncuthick") runs those steps alone, and simulates only the scans they
# read: a second, shorter call after a fix. The thick samples' call (about 7 minutes):
#
#   run(command="GPU_CHECK_ONLY='pytest far thick xpkg ncuthick' bash benchmarks/gpu_check.sh run",
#       carry=[".whl"], timeout_s=540)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
WHEEL_LIST=benchmarks/gpu_wheels.txt
CONSTRAINTS=deploy/constraints-worker.txt
MAX_WHEEL_MIB=40
MIN_STEP_S=20

log() { printf '[gpu_check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# -------------------------------------------------------------------------------- prepare

# name==version of each line of the wheel list; a bare name takes the constraints' pin.
wheel_specs() {
    local line pin
    while IFS= read -r line || [[ -n $line ]]; do
        line=${line%%#*}
        line=${line//[[:space:]]/}
        [[ -z $line ]] && continue
        if [[ $line == *==* ]]; then
            echo "$line"
            continue
        fi
        pin=$(awk -F'==' -v n="$line" 'tolower($1) == tolower(n) { print $2 }' "$CONSTRAINTS")
        if [[ -z $pin ]]; then
            echo "gpu_check: $WHEEL_LIST: $line has no pin in $CONSTRAINTS" >&2
            return 1
        fi
        echo "$line==$pin"
    done <"$WHEEL_LIST"
}

prepare() {
    local pyver=${PYVER:-3.12} lines specs
    lines=$(wheel_specs)
    mapfile -t specs <<<"$lines"
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/*.whl # one version of each: two stop the install on the machine
    log "downloading ${#specs[@]} wheels for CPython $pyver into $WHEELS: ${specs[*]}"
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$WHEELS" "${specs[@]}" 2>&1 | { grep -v "is ignored" || true; }
    local n
    n=$(find "$WHEELS" -maxdepth 1 -type f -name '*.whl' | wc -l)
    if ((n != ${#specs[@]})); then
        echo "gpu_check: $n wheels in $WHEELS for ${#specs[@]} packages" >&2
        return 1
    fi
    ls -l "$WHEELS"
    local bytes
    bytes=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
    log "wheels: $((bytes / 1024)) KiB in all (limit $MAX_WHEEL_MIB MiB)"
    if ((bytes > MAX_WHEEL_MIB * 1024 * 1024)); then
        echo "gpu_check: the wheels are over $MAX_WHEEL_MIB MiB: the working tree must travel" \
            "in 64 MiB" >&2
        return 1
    fi
}

# ------------------------------------------------------------------------------------ run

FAILED=0

# wanted WORD...: whether a step of one of these first words runs (all without GPU_CHECK_ONLY).
wanted() {
    [[ -z ${GPU_CHECK_ONLY:-} ]] && return 0
    local word
    for word in "$@"; do
        [[ " $GPU_CHECK_ONLY " == *" $word "* ]] && return 0
    done
    return 1
}

# step NAME LIMIT_S STDOUT_FILE COMMAND...: COMMAND under what is left of the budget (at most
# LIMIT_S); its stdout appended to STDOUT_FILE, its stderr to the log. Never fails the script.
step() {
    local name=$1 limit=$2 dest=$3
    shift 3
    wanted "${name%%-*}" || return 0 # not asked for (GPU_CHECK_ONLY: steps' first words)
    local left=$((BUDGET - (SECONDS - START)))
    ((limit > left)) && limit=$left
    if ((limit < MIN_STEP_S)); then
        log "SKIP $name: ${left} s of the budget left"
        echo "$name skipped (budget)" >>"$OUT/summary.txt"
        FAILED=1
        return 0
    fi
    local before t0=$SECONDS rc=0
    before=$(wc -l <"$OUT/gpu.jsonl")
    log "START $name (limit ${limit} s): $*"
    [[ $dest == "$OUT/gpu.jsonl" ]] && printf '{"gpu_check_step": "%s", "command": "%s"}\n' \
        "$name" "$*" >>"$dest"
    timeout -k 10 "$limit" "$@" >>"$dest" || rc=$?
    local took=$((SECONDS - t0))
    [[ $dest == "$OUT/gpu.jsonl" ]] && printf '{"gpu_check_step": "%s", "rc": %d, "seconds": %d}\n' \
        "$name" "$rc" "$took" >>"$dest"
    log "END $name: rc=$rc in ${took} s$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')"
    echo "$name rc=$rc seconds=$took" >>"$OUT/summary.txt"
    ((rc == 0)) || FAILED=1
    tail -n +$((before + 1)) "$OUT/gpu.jsonl" | summarize "$name"
}

# One line per bench_gpu.py result: what to read off the output tail at a glance.
read -r -d '' SUMMARIZE <<'EOF' || true
import json, sys
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("metric") == "layers_over_one_layer":
        print(f"   {r['engine']:8} {r['algorithm']:6} {r['field']:4} {r['positions']}x{r['frame']}"
              f" {r['slices']} layers / 1: {r['ratio_median']} (CPU time"
              f" {r['cpu_ratio_median']}; target {1.3 * r['slices']:.2g})")
        continue
    if "seconds_per_iteration" not in r:
        if "skipped" in r and "ptychi" in sys.argv[1]:
            print("  ", r.get("engine"), "skipped:", r["skipped"])
        continue
    keys = ("floor_ratio", "nrmse", "measured_launch_us", "measured_fft_us",
            "first_iteration_seconds")
    extra = " ".join(f"{k}={r[k]:.4g}" for k in keys if isinstance(r.get(k), float))
    if r.get("graph_replays"):
        extra += f" graph_replays={r['graph_replays']}"
    if r.get("slices", 1) > 1 or r.get("modes", 1) > 1:
        extra += f" layers={r.get('slices', 1)} modes={r.get('modes', 1)}"
    if r.get("layer_nrmse"):
        extra += f" layer_nrmse={r['layer_nrmse']}"
    print(f"   {r['engine']:8} {r['algorithm']:6} {r['field']:4} {r['positions']}x{r['frame']}"
          f" batch={r.get('batch_size')} s/it={r['seconds_per_iteration']:.4g} {extra}")
EOF
summarize() { "$PY" -c "$SUMMARIZE" "$1"; }

# profile_kernels STEP NAME NCU_OPTIONS PROFILE_ARGS...: one iteration under ncu, its CSV in
# $OUT/ncu-NAME.csv, its per-kernel summary in the log (run_all's $scans: bash's locals are
# seen by the functions it calls).
profile_kernels() {
    local name=$1 csv=$OUT/ncu-$2.csv extra=$3
    shift 3
    # shellcheck disable=SC2086 # NCU_OPTIONS is a list of words
    step "$name" 75 /dev/stdout ncu --profile-from-start off $extra --clock-control none \
        --print-units base --print-kernel-base function --csv --log-file "$csv" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$PY" benchmarks/profile_gpu.py --scan-cache "$scans" "$@"
    [[ -s $csv ]] && "$PY" benchmarks/profile_gpu.py --summarize "$csv" || true
}

# The background simulations (SIMS: "field case [layers]" -> pid), waited for by the first
# step that needs their scan; one that failed leaves that step to simulate it under its own
# limit.
declare -A SIMS=()

# simulate KEY LIMIT_S WORDS BENCH_ARGS...: bench_gpu.py --simulate-only BENCH_ARGS in the
# background (run_all's $bench) when a step of one of WORDS is to run.
simulate() {
    local key=$1 limit=$2 words=$3
    shift 3
    [[ -n ${SIMS[$key]:-} ]] && return 0 # GPU_CHECK_QUICK: one scan for several cases
    # shellcheck disable=SC2086 # WORDS is a list of words
    wanted $words || return 0
    timeout -k 10 "$limit" "$PY" "${bench[@]}" --simulate-only "$@" >>"$OUT/simulate.log" 2>&1 &
    SIMS[$key]=$!
}

scans_ready() {
    local spec rc t0=$SECONDS waited=0
    for spec in "$@"; do
        [[ -n ${SIMS[$spec]:-} ]] || continue
        waited=1
        rc=0
        wait "${SIMS[$spec]}" || rc=$?
        ((rc == 0)) || log "simulating $spec ended with rc=$rc: its step simulates it"
        SIMS[$spec]=""
    done
    local busy=()
    for spec in "${!SIMS[@]}"; do
        [[ -n ${SIMS[$spec]} ]] && kill -0 "${SIMS[$spec]}" 2>/dev/null && busy+=("$spec")
    done
    local note=${busy:+"; still simulating beside the next step: ${busy[*]}"}
    ((waited)) && log "scans $* ready (waited $((SECONDS - t0)) s)$note"
    return 0
}

record_card() {
    {
        echo "# $(date -u +%FT%TZ) $(git rev-parse HEAD 2>/dev/null || echo 'no git')"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 ||
            echo "nvidia-smi: not available"
        "$PY" -c '
import platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("numpy", "scipy", "h5py", "pydantic", "cupy", "torch", "ptychi"):
    try:
        mod = __import__(name)
        print(name, getattr(mod, "__version__", "?"), mod.__file__)
    except Exception as exc:  # a missing package is a finding here, not an error
        print(name, "NOT IMPORTABLE:", type(exc).__name__, exc)
try:
    import cupy
    print("cuda runtime", cupy.cuda.runtime.runtimeGetVersion(),
          "driver", cupy.cuda.runtime.driverGetVersion(),
          "devices", cupy.cuda.runtime.getDeviceCount())
except Exception as exc:
    print("cupy CUDA: NOT AVAILABLE:", type(exc).__name__, exc)
'
        echo "# pip list"
        "$PY" -m pip list 2>/dev/null || true
    } >"$OUT/card.txt" 2>&1
    head -n 16 "$OUT/card.txt"
}

run_all() {
    BUDGET=${GPU_CHECK_BUDGET:-450}
    START=$SECONDS
    local device=${GPU_CHECK_DEVICE:-cuda} site=${GPU_CHECK_SITE:-/tmp/site}
    local scans=${GPU_CHECK_SCANS:-/tmp/gpu-check-scans}
    local small=4000x128 big=10000x256 tiny=400x64 iters=(--warmup 2 --iterations 10)
    # Thick samples: layers 16 depths of field apart at 128² (1e-4 m; 4e-4 m at 64²); the
    # published cross-package case 16384 x 128², 6 probe modes, 6 layers, batch 1024.
    local quality=100 xpkg=16384x128 dz=1e-4
    if [[ ${GPU_CHECK_QUICK:-0} == 1 ]]; then
        small=400x64 big=400x64 iters=(--warmup 1 --iterations 2) quality=3 xpkg=400x64 dz=4e-4
    fi
    export PYTHONUNBUFFERED=1
    log "run on $(uname -n), device $device, budget ${BUDGET} s, out $OUT"

    local wheels=("$WHEELS"/*.whl)
    if [[ -e ${wheels[0]} ]]; then
        if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "${wheels[@]}" 2>&1 | { grep -v "is ignored" || true; }; then
            log "the wheels did not install: see above"
            FAILED=1
        fi
    else
        log "no wheels in $WHEELS: run 'benchmarks/gpu_check.sh prepare' first and carry .whl"
    fi
    export PYTHONPATH="$site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    record_card
    "$PY" -c "import pydantic, beamflow.ptycho, beamflow.simulate; print('imports: ok')" ||
        { log "the engine does not import: see above"; FAILED=1; }

    # The scans, each in a process of its own, while the GPU tests run; only those that the
    # steps asked for read (the words after each scan: the steps' first words).
    local bench=(benchmarks/bench_gpu.py --scan-cache "$scans")
    simulate "far $small" 240 "far qbatch nographs ncu host quality thick ptychi" \
        --fields far --cases "$small"
    simulate "far $big" 240 "far ncubig ncub128 qbig ptychi" --fields far --cases "$big"
    simulate "near $small" 240 "qnear near" --fields near --cases "$small"
    simulate "near $tiny" 240 "host near" --fields near --cases "$tiny"
    # The exact three-layer simulation: ~12 ms a position and layer on one loaded core.
    simulate "far $small 3layers" 420 "thick ncuthick" --fields far --cases "$small" \
        --slices 3 --slice-spacing "$dz"
    simulate "far $xpkg" 240 "xpkg" --fields far --cases "$xpkg"

    step pytest-gpu 180 /dev/stdout "$PY" -m pytest -m gpu -q --noconftest \
        -p no:cacheprovider --timeout 120 tests/ptycho/gpu/test_ptycho_engine_gpu.py

    # Pty-Chi runs in steps of its own (bp), where the machine's interpreter has it.
    local bp=("$PY" "${bench[@]}" --device "$device" --json --no-launches --score-workers 4
        "${iters[@]}")
    local b=("${bp[@]}" --no-ptychi)
    local j=$OUT/gpu.jsonl
    scans_ready "far $small"
    step far-rpie-lsqml-$small 120 "$j" "${b[@]}" --fields far --cases "$small" \
        --algorithms rpie lsqml
    # Thick samples (issue 34), the cheap first: S layers against one, side by side (their
    # iterations alternated; the thin scan's frames: timing only);
    # the exact three-layer scan, scored per layer; the cross-package case's LSQ-ML and rPIE
    # (the thin scan's frames: its exact simulation costs the host half an hour).
    step thick-ratio-$small 120 "$j" "${b[@]}" --fields far --cases "$small" \
        --algorithms rpie lsqml --slices 1 2 3 6 --slice-spacing "$dz" --thin-frames --no-score
    scans_ready "far $small 3layers"
    step thick-3layers-$small 150 "$j" "${b[@]}" --fields far --cases "$small" \
        --algorithms rpie lsqml --slices 3 --slice-spacing "$dz"
    scans_ready "far $xpkg"
    local x=(--fields far --cases "$xpkg" --modes 6 --slices 6 --slice-spacing "$dz"
        --batch 1024 --thin-frames --no-score --warmup 1 --iterations 4)
    step xpkg-lsqml-$xpkg 150 "$j" "${b[@]}" "${x[@]}" --algorithms lsqml
    step xpkg-rpie-$xpkg 150 "$j" "${b[@]}" "${x[@]}" --algorithms rpie
    if command -v ncu >/dev/null && [[ $device == cuda ]]; then
        profile_kernels ncuthick-lsqml-$small lsqml-3layers "--launch-count 600" \
            --cases "$small" --algorithms lsqml --slices 3 --slice-spacing "$dz"
    fi
    if compgen -G "$WHEELS/ptychi-*.whl" >/dev/null; then
        step xpkg-ptychi-lsqml-$xpkg 150 "$j" "${bp[@]}" "${x[@]}" --algorithms lsqml \
            --ptychi-python "$(command -v "$PY")" --skip-beamflow
    fi
    # The NRMSE by batch size, side by side: 100 iterations at 4000 x 128² and 20 at
    # 10000 x 256² (the issue's figures), each size's objects scored in parallel processes.
    local sweep=("$PY" "${bench[@]}" --device "$device" --json --no-launches --no-ptychi
        --warmup 0 --algorithms rpie lsqml)
    step qbatch-rpie-lsqml-$small 120 "$j" "${sweep[@]}" --fields far --cases "$small" \
        --score-workers 8 --iterations "$quality" --batch 128 256 512 1024
    # The same without CUDA graphs: every launch from Python (the batches' host cost).
    step nographs-far-rpie-lsqml-$small 120 "$j" "${b[@]}" --fields far --cases "$small" \
        --algorithms rpie lsqml --no-graphs --no-score
    # Kernel by kernel, one iteration (benchmarks/profile_gpu.py): the card's busy time beside
    # the wall time says whether the host or the card limits it. ePIE launches its sequence
    # once per set of windows: its first 400 kernels. LSQ-ML at 10000 x 256², batch 512: the
    # case that missed its target on the H100 (2026-11-26).
    if command -v ncu >/dev/null && [[ $device == cuda ]]; then
        profile_kernels ncu-rpie-$small rpie "" --cases "$small" --algorithms rpie
        profile_kernels ncu-lsqml-$small lsqml "" --cases "$small" --algorithms lsqml
        profile_kernels ncu-epie-$small epie "--launch-count 400" --cases "$small" \
            --algorithms epie
        scans_ready "far $big"
        profile_kernels ncubig-lsqml-$big lsqml-big "" --cases "$big" --algorithms lsqml \
            --batch 512
        # The same at the default batch (128), its first 600 kernels (about 13 batches): the
        # fixed cost of a batch, which makes 128 slower than 512 by ~0.4 ms a batch.
        profile_kernels ncub128-lsqml-$big lsqml-b128 "--launch-count 600" --cases "$big" \
            --algorithms lsqml --batch 128
    else
        log "no ncu (or no card): the kernel profile left out"
    fi
    # The host's side of one iteration (cProfile): where the host waits.
    step host-far-$small 60 /dev/stdout "$PY" benchmarks/profile_gpu.py --host --top 15 \
        --device "$device" --scan-cache "$scans" --cases "$small" --algorithms epie rpie
    scans_ready "near $tiny"
    step host-near-$tiny 60 /dev/stdout "$PY" benchmarks/profile_gpu.py --host --top 15 \
        --device "$device" --scan-cache "$scans" --field near --cases "$tiny" --algorithms epie
    scans_ready "far $big"
    step far-rpie-lsqml-$big 180 "$j" "${b[@]}" --fields far --cases "$big" \
        --algorithms rpie lsqml --no-score
    step far-rpie-lsqml-batch512 180 "$j" "${b[@]}" --fields far --cases "$small" "$big" \
        --algorithms rpie lsqml --batch 512 --no-score
    step far-rpie-lsqml-batch256 180 "$j" "${b[@]}" --fields far --cases "$small" "$big" \
        --algorithms rpie lsqml --batch 256 --no-score
    # The NRMSE after 100 iterations (the issue's quality figures) at the default batch and
    # 256, and after 200 at 512 (on the CPU, rPIE at 512 needed 200 for the default's 100).
    local q=("$PY" "${bench[@]}" --device "$device" --json --no-launches --no-ptychi
        --score-workers 4 --warmup 0 --fields far --cases "$small" --algorithms rpie lsqml)
    step quality-default-$small 90 "$j" "${q[@]}" --iterations "$quality"
    step quality-batch256-$small 90 "$j" "${q[@]}" --iterations "$quality" --batch 256
    step quality-batch512-$small 90 "$j" "${q[@]}" --iterations $((2 * quality)) --batch 512
    scans_ready "far $big"
    step qbig-rpie-lsqml-$big 200 "$j" "${sweep[@]}" --fields far --cases "$big" \
        --score-workers 6 --iterations $((quality >= 5 ? quality / 5 : 1)) --batch 128 256 512
    scans_ready "near $small"
    # Near field by batch size: LSQ-ML takes 256 on large scans by default (far-field NRMSE).
    step qnear-rpie-lsqml-$small 120 "$j" "${sweep[@]}" --fields near --cases "$small" \
        --score-workers 4 --iterations "$quality" --batch 128 256
    step far-epie-dm-$small 120 "$j" "${b[@]}" --fields far --cases "$small" --algorithms epie dm
    step nographs-far-epie-$small 120 "$j" "${b[@]}" --fields far --cases "$small" \
        --algorithms epie --no-graphs --no-score
    scans_ready "near $small" "near $tiny"
    step near-rpie-lsqml-dm-$small 120 "$j" "${b[@]}" --fields near --cases "$small" \
        --algorithms rpie lsqml dm
    step near-epie-$tiny 60 "$j" "${b[@]}" --fields near --cases "$tiny" --algorithms epie
    if compgen -G "$WHEELS/ptychi-*.whl" >/dev/null; then
        local ptychi=(--ptychi-python "$(command -v "$PY")" --skip-beamflow)
        step ptychi-rpie-lsqml-$small 150 "$j" "${bp[@]}" "${ptychi[@]}" --fields far \
            --cases "$small" --algorithms rpie lsqml
        step ptychi-rpie-$big 150 "$j" "${bp[@]}" "${ptychi[@]}" --fields far --cases "$big" \
            --algorithms rpie
    else
        log "no Pty-Chi wheel in $WHEELS: its steps left out"
    fi

    # One file for the profiles: the device tool brings back at most 8.
    if compgen -G "$OUT/ncu-*.csv" >/dev/null; then
        tar czf "$OUT/ncu.tgz" -C "$OUT" $(cd "$OUT" && ls ncu-*.csv) && rm -f "$OUT"/ncu-*.csv
    fi
    log "done in $((SECONDS - START)) s; steps:"
    cat "$OUT/summary.txt"
    return "$FAILED"
}

case ${1:-} in
prepare)
    prepare
    ;;
run)
    OUT=${OUT:-$ROOT/gpu-check-out}
    mkdir -p "$OUT"
    : >"$OUT/summary.txt"
    touch "$OUT/gpu.jsonl"
    run_all 2>&1 | tee -a "$OUT/run.log"
    exit "${PIPESTATUS[0]}"
    ;;
*)
    echo "usage: $0 prepare|run   (the header of this file says what each does)" >&2
    exit 2
    ;;
esac
