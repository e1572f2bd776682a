#!/usr/bin/env bash
# One acceptance run of a GPU box (issue 35), everything into one folder, the summary as one small file:
#
#   benchmarks/gpu_acceptance.sh [--tiny] [--out DIR] [--data-root DIR] [--grid-s S] [--full]
#
#   1. what is installed: torch, numpy, pyarrow, scipy, yaml, pytest, and for `bench run` / `bench report` ray,
#      mlflow, polars, matplotlib; missing ones install from carried wheels (.whl/part-*, made by
#      benchmarks/carry_wheels.sh) when all parts are here, else one line says what is missing and how to get it;
#   2. the CUDA tests (tests/exec/test_packed_cuda.py and the CUDA tests of test_packed_bn.py and test_streams.py);
#   3. `bench calibrate` of the grid's models (word_cnn under bench, word_cnn_authors under authors) into
#      DIR/executors.csv, and of ResNet-34 (its streams and bf16 arms against solo fp32) into DIR/figures_resnet.csv;
#   4. the paper's MR grid (tune_configs/mr.yaml: 10 r, 5 seeds, the paper's schedules) under protocol
#      [bench, authors] through `bench run` on Ray with MLflow (DIR/mlflow.db), planned from DIR/executors.csv;
#   5. `bench report` into DIR/report;
#   6. the summary (benchmarks/acceptance_summary.py): DIR/summary.md, printed at the end.
#
# Sized for 10 minutes on one H100/H200: the CUDA tests (~1-2 min), calibration (75 s + 45 s budgets), the grid
# stopped after --grid-s seconds (default 270), the report. To fit it leaves out, by default, the grid's methods
# other than CE and L_DMI (FW, GCE, LCCN, MentorNet, VAT; --full runs all of mr.yaml's), and whatever part of the
# grid has not ended within --grid-s: the summary says how many trials ended, and running the script again with the
# same --out resumes the grid (trials with a result row are skipped). The 700 trials it starts with (CE and L_DMI's
# six settings x 10 r x 5 seeds x 2 protocols) are the issue's 20 CE and L_DMI cells per protocol.
#
# SIGTERM or SIGINT (Ctrl-C) stops it as they stop `bench run`: the signal goes once to the step that runs (the grid
# stops at its trials' last checkpoints, its Ray with it), the summary of what ran is written, and the script exits
# 143 or 130; running it again with the same --out resumes the grid.
#
# --tiny: the same steps on the CPU in a few minutes: calibration of 3 steps an epoch (ResNet-34's on batches of 4),
# the grid cut to r 0.4, seed 0, one setting of L_DMI, 1 + 1 epochs on 256 training sentences; MR from the data root
# when present, else the generated `synthetic` set under protocol bench alone (it has no authors' scripts).
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
tiny=0 full=0 out="" data_root="${BENCH_DATA:-}" grid_s=270
while [ $# -gt 0 ]; do
  case "$1" in
    --tiny) tiny=1 ;;
    --full) full=1 ;;
    --out) out="$2"; shift ;;
    --data-root) data_root="$2"; shift ;;
    --grid-s) grid_s="$2"; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_acceptance: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
out=${out:-acceptance-$(date -u +%Y%m%d-%H%M)}
mkdir -p "$out" || { echo "gpu_acceptance: cannot make the folder $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
start=$(date +%s)
: > "$out/steps.tsv"

# Signals: each step runs in a process group of its own (set -m), so that Ctrl-C (the terminal's group) and a
# scheduler's SIGTERM reach the script alone, and the trap hands the signal to the running step once: the grid's
# `timeout --foreground` passes it on to `bench run` once (without --foreground it sends it twice, to the command and
# to its process group, and a second signal stops a grid at once, not at its checkpoints). Bash runs a trap only
# between commands, so a step is waited for in the background (`wait` returns on a signal).
set -m
stopped="" child=""
forward() { stopped=$1; [ -z "$child" ] || kill -s "$1" "$child" 2>/dev/null; }
trap 'forward INT' INT
trap 'forward TERM' TERM
grid_t0=""

step() {  # step NAME COMMAND...: run it, its output into DIR/NAME.log and on the terminal, its exit code and time
  local name=$1 t0 rc; shift
  echo "== $name: $*"
  t0=$(date +%s)
  "$@" > >(tee "$out/$name.log") 2>&1 &
  child=$!
  while kill -0 "$child" 2>/dev/null; do wait "$child"; done
  wait "$child"; rc=$?
  child=""
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$out/steps.tsv"
  stop_here
  return "$rc"
}

summarize() {  # the summary of what ran: DIR/summary.md, printed
  local wall=0
  [ -z "$grid_t0" ] || wall=$(( ${grid_wall:-$(( $(date +%s) - grid_t0 ))} ))
  "$python" benchmarks/acceptance_summary.py "$out" --grid-wall-s "$wall" \
    --total-wall-s "$(( $(date +%s) - start ))" --mode "$( [ $tiny = 1 ] && echo tiny || echo full )"
}

stop_here() {  # after a signal: the summary of what ran, then exit 128 + the signal's number, as `bench run` does
  [ -n "$stopped" ] || return 0
  trap '' INT TERM  # the summary is written whatever comes now
  summarize
  echo "gpu_acceptance: stopped by SIG$stopped; what ran is in $out/summary.md (running the script again with" \
       "--out $out resumes the grid)" >&2
  exit $(( 128 + $(kill -l "$stopped") ))
}

# 1. What is installed; the carried wheels where something is missing.
missing() { "$python" - "$@" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
}
need="torch numpy pyarrow scipy yaml pytest ray mlflow polars matplotlib"
lack=$(missing $need)
if [ -n "$lack" ] && [ -f .whl/MANIFEST ]; then
  if (cd .whl && sha256sum --quiet -c MANIFEST); then
    echo "== installing $lack from the carried wheels (.whl/)"
    cat .whl/part-* | tar -xf - -C .whl && "$python" -m pip install -q --no-index --find-links .whl/wheels \
      "ray[tune]==2.60.0" "mlflow==3.17.2" polars matplotlib pyarrow scipy pyyaml pytest
    lack=$(missing $need)
  else
    echo "gpu_acceptance: .whl/MANIFEST names parts that are absent or damaged; carry every .whl/part-* file" >&2
  fi
fi
if [ -n "$lack" ]; then
  echo "gpu_acceptance: missing $lack; install them (pip install -e . brings all), or with no network run" \
       "benchmarks/carry_wheels.sh where there is one and carry its .whl/part-* and .whl/MANIFEST here" >&2
  exit 2
fi
if ! "$python" -c "import bench.datasets, bench.baselines" 2>/dev/null; then
  "$python" -m pip install -q --no-deps --no-build-isolation -e . || { echo "gpu_acceptance: cannot install bench" \
    "(pip install --no-deps -e . failed)" >&2; exit 2; }
fi
bench=("$python" -m bench.cli.main)  # an array, not a function: a step runs it as its own process (signals)
if [ -z "$data_root" ]; then
  for d in shared/data ../shared/data /work/shared/data; do [ -d "$d/MR" ] && data_root=$(cd "$d" && pwd) && break; done
fi
data_root=${data_root:-$HOME/.cache/bench/data}
have_mr=0; [ -f "$data_root/MR/rt-polaritydata/rt-polarity.pos" ] && have_mr=1
cuda=$("$python" -c "import torch; print(int(torch.cuda.is_available()))")
if [ "$tiny" = 0 ] && { [ "$cuda" = 0 ] || [ "$have_mr" = 0 ]; }; then
  echo "gpu_acceptance: the full run needs a CUDA device (found: $cuda) and MR under the data root ($data_root:" \
       "found $have_mr); pass --data-root, or run --tiny" >&2
  exit 2
fi
machine=$("$python" -c "import torch
print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU')")
echo "gpu_acceptance: $( [ $tiny = 1 ] && echo tiny || echo full ) run into $out; data $data_root; $machine"

# 2. The CUDA tests (on a CPU they skip: the tiny run checks they are collected).
step cuda_tests "$python" -m pytest -q -rs -p no:cacheprovider tests/exec/test_packed_cuda.py \
  tests/exec/test_packed_bn.py::test_a_packed_resnet_pair_equals_its_solo_trials_on_cuda \
  tests/exec/test_packed_bn.py::test_a_compiled_resnet_pack_trains_as_the_eager_pack \
  tests/exec/test_packed_bn.py::test_a_bf16_pack_runs_its_convolutions_in_bf16_channels_last \
  tests/exec/test_streams.py::test_on_cuda_each_member_trains_on_a_stream_of_its_own_as_its_solo_trial

# 3. Calibration, then 4. the grid, planned from its table.
if [ "$tiny" = 1 ]; then
  device=cpu; quick=(--members 2 --steps 3 --rounds 2); cal_s=60; res_s=30; res_batch=(--batch 4 --steps 1 --rounds 1)
  shrink=(--seeds 0 --set "r=[0.4]" --set epochs=1 --set epochs_warmup=1 --set train_subset=256
          --set "methods.dmi.lr=[1.0e-4]" --set "methods.dmi.batch_size=[128]" --set device=cpu
          --set "resources={cpu: 1, gpu: 0}")
  grid_s=$(( grid_s < 240 ? grid_s : 240 ))
else
  device=cuda; quick=(); cal_s=75; res_s=45; res_batch=(); shrink=()
fi
if [ "$have_mr" = 1 ]; then
  models=word_cnn,word_cnn_authors; data=(--set "protocol=[bench,authors]")
else
  models=mlp; data=(--set dataset=synthetic --set noise=case1 --set "protocol=[bench]")
fi
# ${a[@]+"${a[@]}"}: an array that may be empty, under set -u
step calibrate "${bench[@]}" calibrate --device "$device" --models "$models" ${quick[@]+"${quick[@]}"} \
  --budget-s "$cal_s" --out "$out/executors.csv" --figures "$out/figures_grid.csv" --data-root "$data_root"
step calibrate_resnet "${bench[@]}" calibrate --device "$device" --models resnet34_cifar ${quick[@]+"${quick[@]}"} \
  ${res_batch[@]+"${res_batch[@]}"} --budget-s "$res_s" --out "$out/executors.csv" \
  --figures "$out/figures_resnet.csv" --data-root "$data_root"
methods=(--methods ce,dmi); [ "$full" = 1 ] && methods=()
export BENCH_EXECUTOR_TABLE="$out/executors.csv"  # the grid plans from the rows measured above
grid_t0=$(date +%s)
step grid timeout --foreground -s INT -k 60 "$grid_s" "$python" -m bench.cli.main run tune_configs/mr.yaml --set name=acceptance \
  ${data[@]+"${data[@]}"} ${methods[@]+"${methods[@]}"} ${shrink[@]+"${shrink[@]}"} --yes \
  --results "$out/results" --mlflow-uri "sqlite:///$out/mlflow.db" --data-root "$data_root"
grid_wall=$(( $(date +%s) - grid_t0 ))

# 5. The report, 6. the summary.
step report "${bench[@]}" report "$out/results" --out "$out/report"
summarize
# The grid stopped at --grid-s (timeout's 124) is no failure: the summary counts what ended, a rerun resumes it.
failed=$(awk -F'\t' '$2 != 0 && !($1 == "grid" && $2 == 124) {print $1}' "$out/steps.tsv" | tr '\n' ' ')
[ -z "$failed" ] || { echo "gpu_acceptance: failed steps: $failed(logs in $out)" >&2; exit 1; }
echo "gpu_acceptance: everything in $out; the summary is $out/summary.md"
