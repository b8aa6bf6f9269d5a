#!/usr/bin/env bash
# Run an orthojax experiment on a Cloud TPU VM slice (one host or a pod slice).
#
#   bash launch/tpu_pod.sh --name=oj-e1 --zone=us-central2-b --accelerator=v4-32 \
#       --flagfile=experiments/flags/e1_resnet50_bn.flags \
#       --workdir=gs://BUCKET/orthojax/e1_bn --tfds_data_dir=gs://BUCKET/tensorflow_datasets \
#       [--spot] [--queued] [--reuse] [--code=copy|pull:URL[@REF]] [--delete-after] \
#       [--dry-run] [-- --config.batch_size=1024 --config.optimizer.euclidean.learning_rate=0.4 ...]
#
# Steps, each printed as "+ command" before it runs (--dry-run prints them and
# runs nothing):
#   0. the pod compile check, on this machine: `python -m experiments.<experiment>
#      --flagfile=... --compile_for=<the slice's topology>` compiles the exact train
#      and eval steps for the slice with libtpu (no TPU needed) and stops the launch,
#      before anything is created or billed, if they do not compile or do not fit
#      the chips' HBM (report in $TMPDIR/orthojax-NAME-compile/compile_report.json;
#      launch/README.md says how to read it). --skip-compile-check skips it;
#      --topology overrides the topology derived from --accelerator;
#   1. create the slice (gcloud compute tpus tpu-vm create, or a queued
#      resource with --queued), or reuse it with --reuse;
#   2. put the code on every worker: --code=copy (default) ships `git archive`
#      of the local HEAD with tpu-vm scp; --code=pull:URL[@REF] clones/fetches
#      it on the workers;
#   3. install on every worker: a Python >= 3.11 venv (~/orthojax-venv; the
#      TPU images ship 3.10, so uv provides 3.11), `pip install "jax[tpu]"`,
#      then `pip install -e .`, both under the repo's constraints.txt;
#   4. start `python -m experiments.<experiment> --flagfile=... --workdir=...
#      --distributed [args after --]` on all workers under nohup, with
#      TFDS_DATA_DIR exported; log in ~/orthojax-run.log, pid in
#      ~/orthojax-run.pid on each worker;
#   5. with --delete-after: wait until the run ends, show the log tail, delete
#      the slice. Otherwise print how to follow, stop and delete.
#
# Rerunning the same command (with --reuse while the slice lives) resumes from
# the latest checkpoint in --workdir. See launch/README.md.
set -euo pipefail

PROG=tpu_pod.sh
# Paths on each worker. The ~ is deliberately left unexpanded here: these
# strings go into remote command lines, where the worker's shell expands them.
# shellcheck disable=SC2088
REMOTE_DIR='~/orthojax'
# shellcheck disable=SC2088
REMOTE_VENV='~/orthojax-venv'
# shellcheck disable=SC2088
REMOTE_LOG='~/orthojax-run.log'
# shellcheck disable=SC2088
REMOTE_PID='~/orthojax-run.pid'
POLL_SECONDS=${TPU_POD_POLL_SECONDS:-300}

usage() {
  cat <<'EOF'
usage: bash launch/tpu_pod.sh --name=NAME --zone=ZONE --accelerator=TYPE --flagfile=PATH
                              --workdir=gs://... [options] [-- experiment flags]

required
  --name NAME            TPU VM (slice) name, lowercase letters, digits and '-'
  --zone ZONE            e.g. us-central2-b (v4), us-west4-a (v5e)
  --accelerator TYPE     v4-8, v4-32, v5p-16, v5litepod-8, v5litepod-64, v6e-16, ...
  --flagfile PATH        experiment flagfile, relative to the repository root
  --workdir DIR          checkpoints, metrics, TensorBoard; gs://... (required
                         for multi-host slices: every worker writes there)
options
  --version RUNTIME      TPU software version; default by family: v2/v3/v4
                         tpu-ubuntu2204-base, v5p v2-alpha-tpuv5,
                         v5litepod v2-alpha-tpuv5-lite, v6e v2-alpha-tpuv6e
  --project PROJECT      GCP project (default: gcloud's configured project)
  --spot                 Spot capacity (cheap, preemptible)
  --queued               request through a queued resource (waits for capacity)
  --reuse                use the slice if it already exists, create it otherwise
  --code FORM            copy (default): git archive of local HEAD, scp'd to workers;
                         pull:GIT_URL[@REF]: clone/fetch on the workers
  --experiment MODULE    runs python -m experiments.MODULE (default: train)
  --tfds_data_dir DIR    exported as TFDS_DATA_DIR on the workers (gs://...)
  --python VERSION       Python of the workers' venv (default: 3.11)
  --topology TOPO        compile check target (default from --accelerator: v4-32 ->
                         v4:2x2x4, v5litepod-64 -> v5e:8x8, v6e-16 -> v6e:4x4, ...)
  --skip-compile-check   launch without compiling for the slice first
  --delete-after         wait for the run to finish, then delete the slice
  --dry-run              print every command, one per line prefixed '+ ', run nothing
  -h, --help             this text
  -- ARGS...             passed unchanged to the experiment, after the flagfile
                         (e.g. -- --config.batch_size=1024)
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 2; }
warn() { echo "$PROG: warning: $*" >&2; }
note() { echo "# $*"; }

# Shell-quote one word for display / for a remote command line. Words made of
# safe characters stay bare, the rest are single-quoted; --flag=value keeps
# the --flag= part bare. The result reads back as the same word in bash.
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

# Print a command, then run it (unless --dry-run).
run() {
  show "$@"
  if [[ $DRY_RUN == 0 ]]; then "$@"; fi
}

# ----------------------------------------------------------------- arguments
NAME="" ZONE="" ACCELERATOR="" VERSION="" PROJECT="" CODE="copy" EXPERIMENT="train"
FLAGFILE="" WORKDIR="" TFDS_DATA_DIR_ARG="" PYTHON_VERSION="3.11" TOPOLOGY=""
SPOT=0 QUEUED=0 REUSE=0 DRY_RUN=0 DELETE_AFTER=0 COMPILE_CHECK=1
EXTRA_ARGS=()

set_option() {  # set_option --flag value
  case $1 in
    --name) NAME=$2 ;;
    --zone) ZONE=$2 ;;
    --accelerator) ACCELERATOR=$2 ;;
    --version) VERSION=$2 ;;
    --project) PROJECT=$2 ;;
    --code) CODE=$2 ;;
    --experiment) EXPERIMENT=$2 ;;
    --flagfile) FLAGFILE=$2 ;;
    --workdir) WORKDIR=$2 ;;
    --tfds_data_dir) TFDS_DATA_DIR_ARG=$2 ;;
    --python) PYTHON_VERSION=$2 ;;
    --topology) TOPOLOGY=$2 ;;
  esac
}

VALUE_FLAGS='--name|--zone|--accelerator|--version|--project|--code|--experiment|--flagfile|--workdir|--tfds_data_dir|--python|--topology'
while [[ $# -gt 0 ]]; do
  case $1 in
    --) shift; EXTRA_ARGS=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    --spot) SPOT=1; shift ;;
    --queued) QUEUED=1; shift ;;
    --reuse) REUSE=1; shift ;;
    --dry-run|--dry_run) DRY_RUN=1; shift ;;
    --delete-after|--delete_after) DELETE_AFTER=1; shift ;;
    --skip-compile-check|--skip_compile_check) COMPILE_CHECK=0; shift ;;
    --*=*)
      flag=${1%%=*}
      [[ $flag =~ ^($VALUE_FLAGS)$ ]] || die "unknown option $flag (experiment flags go after --; see --help)"
      set_option "$flag" "${1#*=}"; shift ;;
    --*)
      [[ $1 =~ ^($VALUE_FLAGS)$ ]] || die "unknown option $1 (experiment flags go after --; see --help)"
      [[ $# -ge 2 ]] || die "$1 needs a value"
      set_option "$1" "$2"; shift 2 ;;
    *) die "unexpected argument '$1' (experiment flags go after --; see --help)" ;;
  esac
done

# ---------------------------------------------------------------- validation
[[ -n $NAME ]] || die "--name is required (the TPU VM name, e.g. --name=oj-e1)"
[[ -n $ZONE ]] || die "--zone is required (e.g. --zone=us-central2-b)"
[[ -n $ACCELERATOR ]] || die "--accelerator is required (e.g. --accelerator=v4-32)"
[[ -n $FLAGFILE ]] || die "--flagfile is required (e.g. --flagfile=experiments/flags/e1_resnet50_bn.flags)"
[[ $NAME =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
  || die "--name=$NAME: use lowercase letters, digits and '-', starting with a letter"
[[ $ACCELERATOR =~ ^(v[0-9]+[a-z]*)-([0-9]+)$ ]] \
  || die "--accelerator=$ACCELERATOR: expected a type like v4-32, v5p-16 or v5litepod-64"
FAMILY=${BASH_REMATCH[1]}
SIZE=${BASH_REMATCH[2]}

# Default runtime per family, and whether the slice has more than one host.
# v2/v3/v4/v5p sizes count TensorCores (8 per host), v5litepod/v6e count chips
# (8 on a single-host VM; larger slices span several hosts).
case $FAMILY in
  v2|v3|v4) DEFAULT_VERSION=tpu-ubuntu2204-base; MULTI_HOST=$(( SIZE > 8 )) ;;
  v5p) DEFAULT_VERSION=v2-alpha-tpuv5; MULTI_HOST=$(( SIZE > 8 )) ;;
  v5litepod) DEFAULT_VERSION=v2-alpha-tpuv5-lite; MULTI_HOST=$(( SIZE > 8 )) ;;
  v6e) DEFAULT_VERSION=v2-alpha-tpuv6e; MULTI_HOST=$(( SIZE > 8 )) ;;
  *)
    [[ -n $VERSION ]] || die "--accelerator=$ACCELERATOR: unknown family $FAMILY; pass --version=RUNTIME explicitly"
    DEFAULT_VERSION=""; MULTI_HOST=1 ;;
esac
VERSION=${VERSION:-$DEFAULT_VERSION}

# The slice's topology for the compile check: chip grids of Google's standard
# slice shapes. v4/v5p sizes count TensorCores (2 per chip, megacore), v5e/v6e chips.
default_topology() {
  local chips grid=""
  case $FAMILY in
    v4|v5p)
      chips=$(( SIZE / 2 ))
      case $chips in
        4) grid=2x2x1 ;; 8) grid=2x2x2 ;; 16) grid=2x2x4 ;; 32) grid=2x4x4 ;;
        64) grid=4x4x4 ;; 128) grid=4x4x8 ;; 256) grid=4x8x8 ;; 512) grid=8x8x8 ;;
      esac
      [[ -n $grid ]] && echo "$FAMILY:$grid" ;;
    v5litepod|v6e)
      case $SIZE in
        4) grid=2x2 ;; 8) grid=2x4 ;; 16) grid=4x4 ;; 32) grid=4x8 ;; 64) grid=8x8 ;;
        128) grid=8x16 ;; 256) grid=16x16 ;;
      esac
      [[ -n $grid ]] && echo "${FAMILY/v5litepod/v5e}:$grid" ;;
  esac
  return 0
}
if [[ $COMPILE_CHECK == 1 && -z $TOPOLOGY ]]; then
  TOPOLOGY=$(default_topology)
  [[ -n $TOPOLOGY ]] || die "--accelerator=$ACCELERATOR: no standard chip grid known for the compile check; pass --topology=GEN:GRID (e.g. v5e:4x4) or --skip-compile-check"
fi

if [[ -z $WORKDIR ]]; then
  die "--workdir is required (a gs:// path for checkpoints and logs, e.g. --workdir=gs://BUCKET/orthojax/run1)"
fi
if [[ $WORKDIR != gs://* && $MULTI_HOST == 1 ]]; then
  die "--workdir=$WORKDIR: a multi-host slice ($ACCELERATOR) needs a gs:// path every worker can write"
fi
[[ $EXPERIMENT =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || die "--experiment=$EXPERIMENT: expected a module name under experiments/ (e.g. train)"
[[ $PYTHON_VERSION =~ ^3\.[0-9]+$ ]] || die "--python=$PYTHON_VERSION: expected e.g. 3.11"
[[ $ZONE =~ ^[a-z0-9-]+$ ]] || die "--zone=$ZONE: expected a zone like us-central2-b"
[[ $PROJECT =~ ^[a-z0-9:.-]*$ ]] || die "--project=$PROJECT: expected a project id like my-project"

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case $FLAGFILE in
  "$REPO_ROOT"/*) FLAGFILE=${FLAGFILE#"$REPO_ROOT"/} ;;
  /*) die "--flagfile=$FLAGFILE: give a path inside the repository (relative to its root)" ;;
esac

GIT_URL="" GIT_REF="HEAD"
case $CODE in
  copy) ;;
  pull:*)
    spec=${CODE#pull:}
    [[ -n $spec ]] || die "--code=$CODE: expected pull:GIT_URL[@REF]"
    GIT_URL=$spec
    # A trailing @REF: the part after the last '@', when what precedes it is
    # a whole URL (scheme://host/path, user@host:path or /path) and the ref
    # has no ':' (so git@host:org/repo is not split).
    if [[ $spec == *@* ]]; then
      url=${spec%@*} ref=${spec##*@}
      if [[ -n $ref && $ref != *:* ]] \
          && [[ $url == *://*/* || ( $url != *://* && $url == *:* ) || $url == /* ]]; then
        GIT_URL=$url GIT_REF=$ref
      fi
    fi
    ;;
  *) die "--code=$CODE: unknown form; use --code=copy or --code=pull:GIT_URL[@REF]" ;;
esac

# Warnings only (the run may still be right).
[[ -f $REPO_ROOT/$FLAGFILE ]] || warn "--flagfile=$FLAGFILE not found in $REPO_ROOT; it must exist in the code the workers get"
if [[ $WORKDIR != gs://* ]]; then
  warn "--workdir=$WORKDIR is on the VM's disk: it is lost when the slice is deleted (use gs://)"
fi
if [[ -n $TFDS_DATA_DIR_ARG && $TFDS_DATA_DIR_ARG != gs://* && $MULTI_HOST == 1 ]]; then
  warn "--tfds_data_dir=$TFDS_DATA_DIR_ARG is not gs://: it must exist on every worker"
fi

# ------------------------------------------------------------------ commands
LOCATION=(--zone="$ZONE")
[[ -n $PROJECT ]] && LOCATION+=(--project="$PROJECT")
TPU_VM=(gcloud compute tpus tpu-vm)
QR=(gcloud compute tpus queued-resources)

ssh_all() { run "${TPU_VM[@]}" ssh "$NAME" "${LOCATION[@]}" --worker=all --command="$1"; }

if [[ $QUEUED == 1 ]]; then
  DELETE_CMD=("${QR[@]}" delete "$NAME" "${LOCATION[@]}" --force --quiet)
else
  DELETE_CMD=("${TPU_VM[@]}" delete "$NAME" "${LOCATION[@]}" --quiet)
fi

# Refuse to start a second run on top of a live one (same pid file on each worker).
GUARD="if [ -f $REMOTE_PID ] && kill -0 \"\$(cat $REMOTE_PID)\" 2>/dev/null; then echo \"\$(hostname): a run is already going (pid \$(cat $REMOTE_PID)); stop it first\" >&2; exit 1; fi"

# ----------------------------------------------------------- 0. compile check
if [[ $COMPILE_CHECK == 1 ]]; then
  COMPILE_DIR="${TMPDIR:-/tmp}/orthojax-$NAME-compile"
  CHECK=("${ORTHOJAX_PYTHON:-python3}" -m "experiments.$EXPERIMENT" --flagfile="$FLAGFILE"
         --compile_for="$TOPOLOGY" --workdir="$COMPILE_DIR" "${EXTRA_ARGS[@]}")
  show "${CHECK[@]}"
  if [[ $DRY_RUN == 0 ]]; then
    (cd "$REPO_ROOT" && JAX_PLATFORMS=cpu "${CHECK[@]}") \
      || die "the compile check for $TOPOLOGY failed (above); nothing was created. Fix the flags, or pass --skip-compile-check"
  fi
fi

# ------------------------------------------------------- 1. create or reuse
create_slice() {
  if [[ $QUEUED == 1 ]]; then
    local cmd=("${QR[@]}" create "$NAME" --node-id="$NAME" "${LOCATION[@]}"
               --accelerator-type="$ACCELERATOR" --runtime-version="$VERSION")
    [[ $SPOT == 1 ]] && cmd+=(--spot)
    run "${cmd[@]}"
    local describe=("${QR[@]}" describe "$NAME" "${LOCATION[@]}" --format='value(state.state)')
    show "${describe[@]}"
    if [[ $DRY_RUN == 0 ]]; then
      local state
      while true; do
        state=$("${describe[@]}")
        case $state in
          ACTIVE) echo "queued resource $NAME: ACTIVE"; break ;;
          FAILED|SUSPENDING|SUSPENDED) die "queued resource $NAME is $state; see: ${QR[*]} describe $NAME ${LOCATION[*]}" ;;
          *) echo "queued resource $NAME: $state; checking again in 60 s" >&2; sleep 60 ;;
        esac
      done
    fi
  else
    local cmd=("${TPU_VM[@]}" create "$NAME" "${LOCATION[@]}"
               --accelerator-type="$ACCELERATOR" --version="$VERSION")
    [[ $SPOT == 1 ]] && cmd+=(--spot)
    run "${cmd[@]}"
  fi
}

if [[ $REUSE == 1 ]]; then
  describe=("${TPU_VM[@]}" describe "$NAME" "${LOCATION[@]}" --format='value(state)')
  show "${describe[@]}"
  if [[ $DRY_RUN == 1 ]]; then
    note "--reuse: a dry run assumes $NAME exists and is READY (no create)"
  elif state=$("${describe[@]}" 2>/dev/null); then
    [[ $state == READY ]] || die "slice $NAME exists but is $state; delete it (${DELETE_CMD[*]}) and rerun without --reuse"
    echo "reusing $NAME (READY)"
  else
    echo "$NAME does not exist yet: creating it" >&2
    create_slice
  fi
else
  create_slice
fi

# ------------------------------------------------------------------ 2. code
if [[ $CODE == copy ]]; then
  TARBALL="${TMPDIR:-/tmp}/orthojax-$NAME.tar.gz"
  if [[ $DRY_RUN == 0 ]] && [[ -n $(git -C "$REPO_ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    warn "uncommitted changes are not shipped: --code=copy archives HEAD ($(git -C "$REPO_ROOT" rev-parse --short HEAD))"
  fi
  run git -C "$REPO_ROOT" archive --format=tar.gz --prefix=orthojax/ -o "$TARBALL" HEAD
  run "${TPU_VM[@]}" scp "$TARBALL" "$NAME:orthojax-src.tar.gz" "${LOCATION[@]}" --worker=all
  ssh_all "set -e; $GUARD; rm -rf $REMOTE_DIR; tar -xzf ~/orthojax-src.tar.gz -C ~; rm -f ~/orthojax-src.tar.gz"
else
  ssh_all "set -e; $GUARD; if [ ! -d $REMOTE_DIR/.git ]; then rm -rf $REMOTE_DIR; git clone --quiet $(quote "$GIT_URL") $REMOTE_DIR; fi; git -C $REMOTE_DIR remote set-url origin $(quote "$GIT_URL"); git -C $REMOTE_DIR fetch --quiet --tags origin $(quote "$GIT_REF"); git -C $REMOTE_DIR checkout --quiet --force --detach FETCH_HEAD; git -C $REMOTE_DIR log -1 --format='%h %s'"
fi

# --------------------------------------------------------------- 3. install
ssh_all "set -e; export PATH=\"\$HOME/.local/bin:\$PATH\"; command -v uv >/dev/null || python3 -m pip install --user --quiet uv; [ -x $REMOTE_VENV/bin/python ] || uv venv --quiet --seed --python $PYTHON_VERSION $REMOTE_VENV; $REMOTE_VENV/bin/pip install --quiet -c $REMOTE_DIR/constraints.txt 'jax[tpu]'; $REMOTE_VENV/bin/pip install --quiet -c $REMOTE_DIR/constraints.txt -e $REMOTE_DIR"

# ------------------------------------------------------------------- 4. run
TRAIN=("$REMOTE_VENV/bin/python" -m "experiments.$EXPERIMENT" --flagfile="$FLAGFILE" --workdir="$WORKDIR" --distributed)
TRAIN_LINE="$REMOTE_VENV/bin/python $(quote_all "${TRAIN[@]:1}")"
if [[ ${#EXTRA_ARGS[@]} -gt 0 ]]; then TRAIN_LINE+=" $(quote_all "${EXTRA_ARGS[@]}")"; fi
ENV_LINE="export JAX_PLATFORMS=tpu,cpu"  # fail loudly instead of training on CPU
if [[ -n $TFDS_DATA_DIR_ARG ]]; then ENV_LINE+="; export TFDS_DATA_DIR=$(quote "$TFDS_DATA_DIR_ARG")"; fi
ssh_all "set -e; $GUARD; cd $REMOTE_DIR; $ENV_LINE; echo \"=== \$(date -u) launch on \$(hostname)\" >> $REMOTE_LOG; nohup $TRAIN_LINE >> $REMOTE_LOG 2>&1 < /dev/null & echo \$! > $REMOTE_PID; echo \"\$(hostname): started pid \$!\""

FOLLOW=("${TPU_VM[@]}" ssh "$NAME" "${LOCATION[@]}" --worker=0 --command="tail -n 100 -f $REMOTE_LOG")
STOP=("${TPU_VM[@]}" ssh "$NAME" "${LOCATION[@]}" --worker=all --command="kill \$(cat $REMOTE_PID)")

# ---------------------------------------------------- 5. wait, then delete
if [[ $DELETE_AFTER == 1 ]]; then
  POLL=("${TPU_VM[@]}" ssh "$NAME" "${LOCATION[@]}" --worker=all
        --command="if kill -0 \"\$(cat $REMOTE_PID 2>/dev/null)\" 2>/dev/null; then echo running; else echo finished; fi")
  show "${POLL[@]}"
  if [[ $DRY_RUN == 0 ]]; then
    failures=0
    while true; do
      sleep "$POLL_SECONDS"
      if out=$("${POLL[@]}" 2>/dev/null); then
        failures=0
        [[ $out == *running* ]] || break
      else
        failures=$(( failures + 1 ))
        echo "could not reach $NAME ($failures/5)" >&2
        [[ $failures -lt 5 ]] || break
      fi
    done
  fi
  run "${TPU_VM[@]}" ssh "$NAME" "${LOCATION[@]}" --worker=0 --command="tail -n 30 $REMOTE_LOG" || true
  run "${DELETE_CMD[@]}"
  note "deleted $NAME; checkpoints and metrics stay in $WORKDIR"
else
  note "launched python $(quote_all "${TRAIN[@]:1}" "${EXTRA_ARGS[@]}") on $NAME ($ACCELERATOR, $VERSION)"
  note "follow the log (worker 0):   $(quote_all "${FOLLOW[@]}")"
  note "stop (SIGTERM, checkpoints): $(quote_all "${STOP[@]}")"
  note "resume: rerun this command with --reuse (same --workdir)"
  note "delete the slice (it bills until deleted): $(quote_all "${DELETE_CMD[@]}")"
fi
