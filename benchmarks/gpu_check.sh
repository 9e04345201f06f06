#!/usr/bin/env bash
# Everything in this repository that needs a GPU, in one run on a machine with one: the course at
# full size (benchmarks/course_gpu.py), the GPU tests (pytest -m gpu) and GPT-2 small against the
# compiled peer (benchmarks/bench_torch.py --best-only). Each part can have its own time limit, so
# a slow part leaves the next its turn; the logs, the JSON files and the executed notebooks land in
# OUT (eight files at most), and the script's last lines are a summary. On an H100 (2026-11-26) the
# GPU tests outran 220 s and the benchmark, which compiles four variants, 200 s: give them more.
#
#   benchmarks/gpu_check.sh OUT                          # the whole course, no time limits
#   benchmarks/gpu_check.sh OUT --budget 150 --notebooks 00 01 04 11
#   WHEELS=.whl benchmarks/gpu_check.sh OUT ...          # no Jupyter there: install these wheels first
#
# Arguments after OUT go to course_gpu.py. TESTS_LIMIT_S and BENCH_LIMIT_S (seconds, default
# none) bound the other two parts; PARTS picks the parts (default "course tests bench", e.g.
# PARTS="tests bench" when time is short); GPU_TESTS picks the test paths (default every test
# file that has a GPU test, e.g. GPU_TESTS=tests/recipes); PYTHON picks the interpreter
# (default python3).
set -u
out=${1:?usage: benchmarks/gpu_check.sh OUT [course_gpu.py arguments]}
shift
py=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

limit() {  # limit SECONDS CMD...: run CMD, killed after SECONDS when SECONDS is set
    local s=$1; shift
    if [ -n "$s" ]; then timeout -k 10 "$s" "$@"; else "$@"; fi
}

if [ -n "${WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
        --target "$work/site" "$WHEELS"/*.whl || exit 2
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$repo" || exit 2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

parts=" ${PARTS:-course tests bench} "
course=skipped tests=skipped bench=skipped
if [[ $parts == *" course "* ]]; then
    "$py" benchmarks/course_gpu.py --out "$work/course" --results "$out" "$@" 2>&1 | tee "$out/course.log"
    course=${PIPESTATUS[0]}
    # The executed notebooks, outputs and kernel logs included, in one file (nothing else is kept).
    tar czf "$out/course_notebooks.tgz" -C "$work/course" notebooks 2>/dev/null
fi

if [[ $parts == *" tests "* ]]; then
    gpu_tests=${GPU_TESTS:-$(grep -rl "mark.gpu" tests --include='test_*.py' | sort)}
    # shellcheck disable=SC2086 # one argument per file
    limit "${TESTS_LIMIT_S:-}" "$py" -m pytest -m gpu -v --tb=short -p no:cacheprovider $gpu_tests 2>&1 \
        | tee "$out/gpu_tests.log"
    tests=${PIPESTATUS[0]}
fi

if [[ $parts == *" bench "* ]]; then
    limit "${BENCH_LIMIT_S:-}" "$py" benchmarks/bench_torch.py --best-only --skip-resnet --batches 12 \
        --json "$out/bench_torch.json" 2>&1 | tee "$out/bench_torch.log"
    bench=${PIPESTATUS[0]}
fi

echo "gpu_check: course exit $course, gpu tests exit $tests, bench_torch exit $bench (124: its time limit)"
[ "$tests" = skipped ] || tail -n 1 "$out/gpu_tests.log"
for status in "$course" "$tests" "$bench"; do
    [ "$status" = 0 ] || [ "$status" = skipped ] || exit 1
done
