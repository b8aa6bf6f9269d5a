#!/usr/bin/env bash
# Multi-node GPU training of an orthojax experiment under SLURM.
#
#   sbatch [--nodes=2 --gpus-per-node=8 --time=24:00:00 --partition=...] \
#       launch/gpu_slurm.sh --flagfile=experiments/flags/e1_resnet50_bn.flags \
#       --workdir=/shared/runs/e1_bn [--tfds_data_dir=/shared/tensorflow_datasets] \
#       [--mode=explicit|auto] [--port=N] [--experiment=train] \
#       [-- --config.batch_size=1024 --config.optimizer.euclidean.learning_rate=0.4 ...]
#
# The #SBATCH lines below are defaults; sbatch command-line options override
# them. Submit from the repository root (or set REPO_DIR) with the Python
# environment that has orthojax installed active (or set PYTHON=/path/to/python);
# sbatch passes the environment on to the job.
#
# Two ways to start JAX's distributed runtime, both one `srun`:
#   --mode=explicit (default): one process per node driving all its GPUs.
#       The coordinator is the first host of $SLURM_JOB_NODELIST
#       (scontrol show hostnames) at --port; each task gets
#       --coordinator_address=HOST:PORT --num_processes=$SLURM_NNODES
#       --process_id=$SLURM_PROCID. JAX_LOCAL_DEVICE_IDS is set to all the
#       node's GPUs: without it JAX's SLURM detection, which runs even with an
#       explicit address, would give each process only GPU #$SLURM_LOCALID.
#   --mode=auto: `--distributed`, i.e. jax.distributed.initialize() with no
#       arguments. JAX reads SLURM's variables itself and assumes one process
#       per GPU (each takes GPU #$SLURM_LOCALID), so this mode runs
#       gpus-per-node tasks on each node; coordinator port from --port or
#       JAX's default (61440 + job id % 4096).
#
# Preemption / time limit: --signal=TERM@300 makes SLURM send SIGTERM to the
# training processes 5 minutes before the time limit; the trainer then saves
# a checkpoint and exits with status 75 (EX_TEMPFAIL, "preempted, checkpoint
# saved"); this script then requeues the job (`scontrol requeue`), and the
# requeued job resumes from the latest checkpoint in --workdir, which must be on
# storage every node sees (shared filesystem or gs://).
#
# DRY_RUN=1 prints the environment and the srun command (lines prefixed '+ ')
# and runs nothing; it still needs the SLURM variables (SLURM_JOB_NODELIST,
# SLURM_NNODES, ...) and scontrol.
#
#SBATCH --job-name=orthojax
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@300
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
set -euo pipefail

PROG=gpu_slurm.sh
DRY_RUN=${DRY_RUN:-0}
# XLA flags appended to XLA_FLAGS for GPU performance. The latency-hiding
# scheduler (overlaps collectives with compute) is a flag of the XLA in the
# pinned jaxlib (constraints.txt); an unknown XLA flag aborts at start-up, so
# set GPU_XLA_FLAGS="" if a newer jaxlib drops it.
GPU_XLA_FLAGS=${GPU_XLA_FLAGS---xla_gpu_enable_latency_hiding_scheduler=true}
# Further flags people use, workload-dependent, not set here (check them
# against your jaxlib before use):
#   --xla_gpu_enable_triton_gemm=false
#   --xla_gpu_all_reduce_combine_threshold_bytes=134217728
#   --xla_gpu_enable_command_buffer=
# NCCL: export NCCL_DEBUG=WARN; NCCL_SOCKET_IFNAME / NCCL_IB_HCA as your
# cluster's documentation says.

die() { echo "$PROG: error: $*" >&2; exit 2; }
warn() { echo "$PROG: warning: $*" >&2; }
note() { echo "# $*"; }

quote() {
  local s=$1 sq="'\\''"
  if [[ -n $s && $s =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$s"
  elif [[ $s =~ ^(--[A-Za-z0-9_-]+=)(.+)$ ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    quote "${BASH_REMATCH[2]}"
  else
    printf "'%s'" "${s//\'/"$sq"}"
  fi
}

quote_all() {
  local out="" a
  for a in "$@"; do out+="${out:+ }$(quote "$a")"; done
  printf '%s' "$out"
}

show() { printf '+ %s\n' "$(quote_all "$@")"; }

setenv() {  # setenv NAME VALUE: export, and print it
  show export "$1=$2"
  export "$1=$2"
}

usage() {
  sed -n '2,/^#SBATCH/p' "${BASH_SOURCE[0]}" | sed -e '/^#SBATCH/d' -e 's/^# \{0,1\}//'
}

# ----------------------------------------------------------------- arguments
FLAGFILE="" WORKDIR="" TFDS_DIR="" EXPERIMENT=train MODE=explicit
PORT=${COORDINATOR_PORT:-} PYTHON=${PYTHON:-python}
EXTRA_ARGS=()
VALUE_FLAGS='--flagfile|--workdir|--tfds_data_dir|--experiment|--mode|--port|--python'
set_option() {
  case $1 in
    --flagfile) FLAGFILE=$2 ;;
    --workdir) WORKDIR=$2 ;;
    --tfds_data_dir) TFDS_DIR=$2 ;;
    --experiment) EXPERIMENT=$2 ;;
    --mode) MODE=$2 ;;
    --port) PORT=$2 ;;
    --python) PYTHON=$2 ;;
  esac
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --) shift; EXTRA_ARGS=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    --*=*)
      flag=${1%%=*}
      [[ $flag =~ ^($VALUE_FLAGS)$ ]] || die "unknown option $flag (experiment flags go after --)"
      set_option "$flag" "${1#*=}"; shift ;;
    --*)
      [[ $1 =~ ^($VALUE_FLAGS)$ ]] || die "unknown option $1 (experiment flags go after --)"
      [[ $# -ge 2 ]] || die "$1 needs a value"
      set_option "$1" "$2"; shift 2 ;;
    *) die "unexpected argument '$1' (experiment flags go after --)" ;;
  esac
done

# ---------------------------------------------------------------- validation
[[ -n $FLAGFILE ]] || die "--flagfile is required (e.g. --flagfile=experiments/flags/e1_resnet50_bn.flags)"
[[ -n $WORKDIR ]] || die "--workdir is required (a directory every node sees: checkpoints, logs)"
[[ $MODE == explicit || $MODE == auto ]] || die "--mode=$MODE: use explicit or auto"
[[ $EXPERIMENT =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || die "--experiment=$EXPERIMENT: expected a module name under experiments/"
[[ -z $PORT || $PORT =~ ^[0-9]+$ ]] || die "--port=$PORT: expected a number"
[[ -n ${SLURM_JOB_NODELIST:-} ]] || die "SLURM_JOB_NODELIST is unset: not inside a SLURM job; submit with sbatch launch/gpu_slurm.sh ..."
[[ ${SLURM_NNODES:-} =~ ^[0-9]+$ ]] || die "SLURM_NNODES is unset: not inside a SLURM job; submit with sbatch launch/gpu_slurm.sh ..."
command -v scontrol >/dev/null || die "scontrol not found on PATH (needed to expand SLURM_JOB_NODELIST)"

REPO_DIR=${REPO_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}
[[ -f $REPO_DIR/experiments/$EXPERIMENT.py ]] \
  || die "no experiments/$EXPERIMENT.py in $REPO_DIR: submit from the repository root or set REPO_DIR"

mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
[[ ${#HOSTS[@]} -gt 0 && -n ${HOSTS[0]} ]] || die "scontrol show hostnames $SLURM_JOB_NODELIST returned no host"
[[ ${#HOSTS[@]} -eq $SLURM_NNODES ]] \
  || warn "SLURM_JOB_NODELIST has ${#HOSTS[@]} hosts but SLURM_NNODES=$SLURM_NNODES"
COORDINATOR_HOST=${HOSTS[0]}
NNODES=$SLURM_NNODES

# GPUs per node: --gpus-per-node (may read "a100:8") or what SLURM bound here.
GPUS_PER_NODE=${SLURM_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}
GPUS_PER_NODE=${GPUS_PER_NODE##*:}
[[ -z $GPUS_PER_NODE || $GPUS_PER_NODE =~ ^[0-9]+$ ]] || GPUS_PER_NODE=""

if [[ $MODE == explicit ]]; then
  TASKS_PER_NODE=1
  PORT=${PORT:-$(( 29500 + ${SLURM_JOB_ID:-0} % 1000 ))}
else
  [[ -n $GPUS_PER_NODE ]] \
    || die "--mode=auto runs one process per GPU: submit with --gpus-per-node=N (SLURM_GPUS_PER_NODE is unset)"
  TASKS_PER_NODE=$GPUS_PER_NODE
fi
NTASKS=$(( NNODES * TASKS_PER_NODE ))
[[ -f $REPO_DIR/$FLAGFILE || -f $FLAGFILE ]] || warn "--flagfile=$FLAGFILE not found from $REPO_DIR"

# ------------------------------------------------------------- environment
cd "$REPO_DIR"
note "job ${SLURM_JOB_ID:-?}: $NNODES node(s) [${HOSTS[*]}], ${GPUS_PER_NODE:-?} GPU(s) each, mode $MODE, $NTASKS process(es)"
show cd "$REPO_DIR"
# tf.data only needs the CPU; orthojax installs tensorflow-cpu and hides GPUs
# from TF. If a GPU build of TF is present anyway, stop it from reserving all
# GPU memory next to JAX. (CUDA_VISIBLE_DEVICES is left alone: JAX needs it.)
setenv TF_FORCE_GPU_ALLOW_GROWTH true
if [[ -n $GPU_XLA_FLAGS ]]; then
  setenv XLA_FLAGS "${XLA_FLAGS:+$XLA_FLAGS }$GPU_XLA_FLAGS"
fi
if [[ -n $TFDS_DIR ]]; then
  setenv TFDS_DATA_DIR "$TFDS_DIR"
fi
if [[ $MODE == auto && -n $PORT ]]; then
  setenv JAX_COORDINATOR_PORT "$PORT"
fi

# ------------------------------------------------------------------ command
TRAIN=("$PYTHON" -m "experiments.$EXPERIMENT" --flagfile="$FLAGFILE" --workdir="$WORKDIR")
if [[ $MODE == explicit ]]; then
  TRAIN+=(--coordinator_address="$COORDINATOR_HOST:$PORT" --num_processes="$NNODES")
  # Runs in each task: all the node's GPUs for this one process, then the
  # task's own --process_id.
  # shellcheck disable=SC2016  # expanded by the task's shell, not here
  TASK_SCRIPT='set -e; if [ -z "${JAX_LOCAL_DEVICE_IDS:-}" ]; then n=0; if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then n=$(printf "%s\n" "$CUDA_VISIBLE_DEVICES" | tr , "\n" | grep -c .); elif [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then n=$SLURM_GPUS_ON_NODE; elif command -v nvidia-smi >/dev/null; then n=$(nvidia-smi -L | grep -c "^GPU"); fi; if [ "$n" -gt 0 ]; then export JAX_LOCAL_DEVICE_IDS=$(seq -s, 0 $((n - 1))); fi; fi; exec "$@" --process_id="$SLURM_PROCID"'
else
  TRAIN+=(--distributed)
  # shellcheck disable=SC2016
  TASK_SCRIPT='exec "$@"'
fi
TRAIN+=("${EXTRA_ARGS[@]}")

SRUN=(srun --nodes="$NNODES" --ntasks="$NTASKS" --ntasks-per-node="$TASKS_PER_NODE")
# Every task sees all the node's GPUs (explicit: its one process drives them
# all; auto: each process takes GPU #SLURM_LOCALID of them).
[[ -n $GPUS_PER_NODE ]] && SRUN+=(--gpus-per-node="$GPUS_PER_NODE")
if [[ ${SLURM_CPUS_ON_NODE:-} =~ ^[0-9]+$ ]] && (( SLURM_CPUS_ON_NODE >= TASKS_PER_NODE )); then
  SRUN+=(--cpus-per-task=$(( SLURM_CPUS_ON_NODE / TASKS_PER_NODE )))  # tf.data decoding threads
fi
SRUN+=(--kill-on-bad-exit=1 --label bash -c "$TASK_SCRIPT" orthojax-task "${TRAIN[@]}")

show "${SRUN[@]}"
if [[ $MODE == explicit ]]; then
  note "task ${SLURM_PROCID:-0} of $NTASKS runs: $(quote_all "${TRAIN[@]}") --process_id=${SLURM_PROCID:-0}"
else
  note "task ${SLURM_PROCID:-0} of $NTASKS runs: $(quote_all "${TRAIN[@]}") (JAX reads SLURM_PROCID=${SLURM_PROCID:-0}, SLURM_NTASKS=$NTASKS)"
fi
if [[ $DRY_RUN == 1 ]]; then
  exit 0
fi
# Exit status 75 (EX_TEMPFAIL) is the trainer's "preempted, checkpoint saved":
# requeue the job, which resumes from that checkpoint when it starts again.
status=0
"${SRUN[@]}" || status=$?
if [[ $status == 75 && -n ${SLURM_JOB_ID:-} ]]; then
  note "preempted with a checkpoint saved (exit 75): requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID" || warn "scontrol requeue $SLURM_JOB_ID failed; resubmit by hand"
fi
exit "$status"
