#!/usr/bin/env bash
# Every benchmark behind docs/benchmarks.md, then the tables made from what they wrote:
#   docs/run_benchmarks.sh              all jobs (collio-bench's default iterations)
#   ITER=12 docs/run_benchmarks.sh      12 iterations per job (the sweep chooses its calls)
#   docs/run_benchmarks.sh zarr-aligned hdf5     only these jobs (names as below)
# Run it from an activated virtualenv with collio installed with '.[mpich,test]'.
# Each job holds the shared CPU lock while it runs, so jobs of other users of the machine
# neither slow it down nor get slowed down by it.  A job writes docs/results/NAME.json
# (the simulator's, which list every aggregator's rounds, gzipped: NAME.json.gz).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/results
mkdir -p "$out"
lock=${COLLIO_CPU_LOCK:-/tmp/collio-cpu.lock}
iter=(); [ -n "${ITER:-}" ] && iter=(-i "$ITER")
six=collio,collio-shuffle,mpiio,mpiio-tuned,posix,ceiling
levels=collio,collio-two-level,collio-one-level,mpiio  # two-level-*: 8 ranks as 2 nodes

jobs=(
  "colblock|--compare $six"
  "cyclic|--pattern cyclic --compare $six"
  "ior|--pattern ior -s 4096 -b 8k -t 8k --compare $six"
  "rowblock|--pattern rowblock --compare $six"
  "single-copy-off-colblock|--compare collio,collio-shuffle,mpiio-tuned,ceiling"
  "single-copy-off-cyclic|--pattern cyclic --compare collio,collio-shuffle,mpiio-tuned,ceiling"
  "zarr-aligned|--compare collio-zarr,zarr-plain -O chunks=512"
  "zarr-misaligned|--compare collio-zarr,zarr-locked -O chunks=768"
  "hdf5|--compare collio-hdf5,hdf5-gather,h5py-mpio"
  "hdf5-gzip|--compare collio-hdf5,hdf5-gather -O codec=gzip,chunks=512"
  "mpiio|--compare collio,collio-mpiio"
  "mpi-file|--compare collio,collio-mpi,mpiio -i 42"  # page-cache reads take milliseconds: many whole cycles of orders
  "s3|--compare collio-s3,s3-gather,s3-ceiling"
  "checkpoint|--pattern checkpoint --size 256MiB -i 30"  # a save's time, and an 80 ms compute loop beside 4 ranks on these cores, vary from one iteration to the next: more samples
  "checkpoint-background|--pattern checkpoint --size 256MiB -i 30 --hints free_replaced=background"
  "checkpoint-free-in-commit|--pattern checkpoint --size 256MiB -i 30 --hints free_replaced=commit"
  "sweep|--sweep"
  "two-level-colblock|--compare $levels"
  "two-level-cyclic|--pattern cyclic --compare $levels"
  "calibrate-4|--calibrate"
  "calibrate-8|--calibrate"  # 8 ranks as 2 nodes: one and two levels
)
sim="--simulate --ranks 65536 --size 1TiB"
sims=(
  "sim-colblock|$sim --pattern colblock --cb-nodes 512"
  "sim-rowblock|$sim --pattern rowblock --cb-nodes 512"
  "sim-block2d|$sim --pattern block2d --cb-nodes 512"
  "sim-cyclic|$sim --pattern cyclic --cb-nodes 512"
  "sim-cube|$sim --pattern cube --cb-nodes 512"
  "sim-ior|--simulate --ranks 65536 --pattern ior -b 1m -s 16 --cb-nodes 512"
  "sim-ior-small|--simulate --ranks 65536 --pattern ior -s 4096 -b 8k -t 8k --cb-nodes 512"
  "sim-cyclic-1x1|$sim --pattern cyclic --cyclic-block 1 --cb-nodes 512"
  "sim-default-colblock|$sim --pattern colblock"
  "sim-default-cyclic|$sim --pattern cyclic"
  "sim-checkpoint|$sim --pattern checkpoint -s 1000"
)

wanted() {  # wanted NAME [REQUESTED...]: no request means every job
  local name=$1 n; shift
  [ $# -eq 0 ] && return 0
  for n; do [ "$n" = "$name" ] && return 0; done
  return 1
}

for job in "${jobs[@]}"; do
  name=${job%%|*} args=${job#*|}
  wanted "$name" ${1+"$@"} || continue
  set_env=() n=4
  [[ $name == single-copy-off-* ]] && set_env=(MPIR_CVAR_CH4_CMA_ENABLE=0)
  [[ $name == two-level-* || $name == calibrate-8 ]] && set_env=(COLLIO_RANKS_PER_NODE=4) n=8
  # the sweep picks its calls per size itself (-i there is calls per size); its tables are longer
  it=("${iter[@]}") shown=30; [ "$name" = sweep ] && it=() shown=70
  echo "== $name: mpiexec -n $n collio-bench $args"
  # shellcheck disable=SC2086  # args are words
  flock "$lock" env "${set_env[@]}" timeout 1800 mpiexec -n "$n" \
    collio-bench $args "${it[@]}" --json "$out/$name.json" | tail -n "$shown"
done
# the simulator's jobs take seconds each: one turn of the lock for all of them
{
  flock 9
  for job in "${sims[@]}"; do
    name=${job%%|*} args=${job#*|}
    wanted "$name" ${1+"$@"} || continue
    echo "== $name: collio-bench $args"
    # shellcheck disable=SC2086
    timeout 1800 collio-bench $args --json "$out/$name.json" | tail -n 4
    gzip -9 -n -f "$out/$name.json"  # every array of every aggregator: megabytes of JSON
  done
} 9>"$lock"
python docs/make_benchmarks.py
