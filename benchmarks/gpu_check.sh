#!/usr/bin/env bash
# The simulator's checks on a GPU host, in one go (issue 26): on a machine with an NVIDIA GPU and
# tuner's tritonserver (the README's GPU section; or the packed bundle), for the encoder_torch template:
#   1. the profile (`tuner profile`): execution time per rows x length on the GPU, per-request cost;
#   2. the conformance suite (tests/test_simulate_conformance.py, where pytest is installed): the
#      simulator's batches against Triton's own statistics;
#   3. a fidelity subset (benchmarks/simulator_fidelity.py on a 4-point grid): capacity error and order;
#   4. the model strategy's quick start on encoder_torch (a short `tuner tune`, search.strategy: model).
# Each step has its own time limit (under 10 minutes in all); every figure goes to OUT/gpu-check.json.
#
#   bash benchmarks/gpu_check.sh [OUT]            (OUT: default ./gpu-check; PY: the interpreter)
#   CPU=1 bash benchmarks/gpu_check.sh /tmp/gc    (the same steps on a CPU, as a smoke test of the script)
#   STEPS="profile model" bash benchmarks/gpu_check.sh    (some of the steps; the profile is the others' input)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-gpu-check}" && cd "${1:-gpu-check}" && pwd)
PY=${PY:-python3}
cd "$here" || exit 1
echo "gpu_check: writing to $out" >&2

# Studies derived from examples/encoder_torch.yaml, with absolute paths (they live in OUT).
"$PY" - "$out" "${CPU:-0}" <<'EOF' || exit 1
import sys, pathlib, yaml
out, cpu = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
src = pathlib.Path("examples/encoder_torch.yaml").resolve()
base = yaml.safe_load(src.read_text())
base["model_repository"] = str((src.parent / base["model_repository"]).resolve())
base["traffic"]["path"] = str((src.parent / base["traffic"]["path"]).resolve())
if cpu:  # the example's own CPU smoke settings (see its header)
    base["traffic"]["speed"] = 0.25
    base["sla"]["latency_ms"] = 500
    base["replay"]["lag_budget_ms"] = 50
    base["search"]["capacity"] = {"step_duration_s": 2.0, "tolerance": 0.3, "start_speed": 0.5,
                                  "max_speed": 4, "max_steps": 4}
    # batches up to 8: the CPU shape's 64 x 512 tokens take seconds each, the profile's grid minutes
    base["search"]["max_batch_size"] = {"low": 1, "high": 8, "log": True}
else:  # the example's load and SLA, its measurements shortened to fit a lease of minutes: the busiest
    # 6 s (at 32x) of the trace as the recorded load, capacity steps of 4 s to within 20 %
    base["traffic"]["busiest_s"] = 192
    base["measurement"] = {"warmup_max_s": 20}
    base["search"]["capacity"] = {"step_duration_s": 4.0, "tolerance": 0.2, "start_speed": 64,
                                  "max_speed": 1000, "max_steps": 5}
for name, search in {
    "profile": {},
    "fidelity": {"sampler": "grid", "trials": 10,
                 "max_batch_size": {"low": 2, "high": 8, "step": 6} if cpu else {"low": 8, "high": 32, "step": 24},
                 "max_queue_delay_microseconds": {"low": 0, "high": 4000, "step": 4000},
                 "instance_count": {"low": 1, "high": 1}},
    # the model strategy reads step 1's profile (it would measure the same one again)
    "model": {"strategy": "model", "model_top": 2, "trials": 4, "top_k": 1, "remeasure_repeats": 1,
              "profile": str(out / "profile.csv")},
}.items():
    study = {**base, "name": f"gpu-check-{name}", "output": str(out / name),
             "search": {**base.get("search", {}), **search}}
    (out / f"{name}.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
EOF

STEPS=" ${STEPS:-profile model fidelity conformance} "
step() {  # step NAME LIMIT_S COMMAND...: runs it, logs to OUT/NAME.log, records rc and seconds
    local name=$1 limit=$2; shift 2
    case "$STEPS" in *" $name "*) ;; *) echo "$name not-run 0" >>"$out/steps.txt"; return ;; esac
    [ "${CPU:-0}" = 1 ] && limit=$((limit * 3))  # a CPU computes the model far slower
    local t0=$SECONDS
    echo "gpu_check: $name (limit ${limit}s): $*" >&2
    timeout --signal=INT --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name $rc $((SECONDS - t0))" >>"$out/steps.txt"
    echo "gpu_check: $name: exit $rc after $((SECONDS - t0)) s" >&2
}
: >"$out/steps.txt"
step profile 80 "$PY" -m tuner profile "$out/profile.yaml" -o "$out/profile.csv"
step model 190 "$PY" -m tuner tune "$out/model.yaml" --quiet
step fidelity 170 "$PY" benchmarks/simulator_fidelity.py "$out/fidelity.yaml" --profile "$out/profile.csv" \
    --output "$out/fidelity-out"
if "$PY" -c "import pytest" 2>/dev/null || [[ "$STEPS" != *" conformance "* ]]; then
    step conformance 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_simulate_conformance.py
else
    echo "conformance skipped-no-pytest 0" >>"$out/steps.txt"
fi

# One JSON: each step's exit and time, the GPU, and the figures its outputs hold.
"$PY" - "$out" <<'EOF'
import json, pathlib, subprocess, sys
out = pathlib.Path(sys.argv[1])
steps = {}
for line in (out / "steps.txt").read_text().splitlines():
    name, rc, seconds = line.split()
    steps[name] = {"exit": rc, "seconds": int(seconds)}
for name in steps:
    log = out / f"{name}.log"
    if log.is_file():
        steps[name]["last_lines"] = log.read_text(errors="replace").splitlines()[-8:]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError):
    gpu = "none (no nvidia-smi)"
figures = {}
for name, path in {"fidelity": out / "fidelity-out", "model": out / "model" / "summary.json"}.items():
    found = sorted(path.glob("*.json")) if path.is_dir() else ([path] if path.is_file() else [])
    for f in found:
        try:
            figures[f"{name}/{f.name}"] = json.loads(f.read_text())
        except ValueError:
            pass
profile = out / "profile.csv"
result = {"gpu": gpu, "steps": steps, "profile_csv": profile.read_text() if profile.is_file() else None,
          "figures": figures}
(out / "gpu-check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
print(f"{'step':<12} {'exit':>6} {'seconds':>8}")
for name, s in steps.items():
    print(f"{name:<12} {s['exit']:>6} {s['seconds']:>8}")
print(f"gpu: {gpu}\nwrote {out / 'gpu-check.json'}")
EOF
