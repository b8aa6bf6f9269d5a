"""launch/tpu_pod.sh and launch/gpu_slurm.sh, without gcloud, TPUs or SLURM.

Dry runs are checked command by command (lines '+ ...', parsed back with
shlex, so quoting is checked too). Real runs go through fake `gcloud`,
`srun` and `scontrol` executables on PATH: the fake gcloud runs each
`tpu-vm ssh --command` in bash on two simulated workers (separate HOMEs),
so the remote command lines themselves are executed.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import textwrap
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TPU = REPO / "launch" / "tpu_pod.sh"
GPU = REPO / "launch" / "gpu_slurm.sh"
FLAGFILE = "experiments/flags/e1_resnet50_bn.flags"
WORKDIR = "gs://bkt/orthojax/e1_bn"
TFDS = "gs://bkt/tensorflow_datasets"
BASE = ["--name=oj-e1", "--zone=us-central2-b", "--accelerator=v4-32",
        f"--flagfile={FLAGFILE}", f"--workdir={WORKDIR}", f"--tfds_data_dir={TFDS}"]


def _write_exe(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(textwrap.dedent(text).lstrip())
  path.chmod(0o755)
  return path


def _bash(script, args, env=None, cwd=REPO, timeout=60):
  full_env = dict(os.environ)
  full_env.update(env or {})
  return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                        env=full_env, cwd=cwd, timeout=timeout)


def _is_compile_check(argv: list[str]) -> bool:
  return any(a.startswith("--compile_for=") for a in argv)


def _commands(stdout: str, compile_check: bool = False) -> list[list[str]]:
  """The '+ ' lines as argv lists (without the local compile check unless asked)."""
  cmds = [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]
  return [c for c in cmds if compile_check or not _is_compile_check(c)]


def _flag(argv: list[str], name: str) -> str:
  values = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
  assert len(values) == 1, (name, argv)
  return values[0]


def _remote(argv: list[str]) -> str:
  return _flag(argv, "--command")


def _words(command_line: str) -> list[str]:
  """Shell words of a remote command line, with ; && >> & as their own tokens."""
  lexer = shlex.shlex(command_line, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  return list(lexer)


def _one_error(stderr: str, flag: str) -> None:
  errors = [line for line in stderr.splitlines() if "error:" in line]
  assert len(errors) == 1 and flag in errors[0], stderr


@pytest.fixture
def no_gcloud(tmp_path):
  """PATH with a gcloud that records any call, so a dry run can prove it ran nothing."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "calls.log"
  for name in ("gcloud", "srun"):
    _write_exe(bin_dir / name, f"""
        #!/usr/bin/env bash
        echo "{name} $*" >> {log}
        """)
  return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}, log


# --------------------------------------------------------------------- lint

@pytest.mark.parametrize("script", [TPU, GPU], ids=lambda p: p.name)
def test_script_passes_shellcheck_or_bash_n(script):
  if shutil.which("shellcheck"):
    proc = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True)
  else:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script,needle", [(TPU, "--accelerator"), (GPU, "--mode=explicit")],
                         ids=["tpu_pod.sh", "gpu_slurm.sh"])
def test_help(script, needle):
  proc = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
  assert proc.returncode == 0 and needle in proc.stdout


# ------------------------------------------------------------ tpu dry runs

def test_tpu_dry_run_prints_the_whole_sequence_and_runs_nothing(no_gcloud):
  env, log = no_gcloud
  extra = ["--config.batch_size=1024", "--config.optimizer.learning_rate=0.4",
           "--note=it's a test"]
  proc = _bash(TPU, ["--dry-run", *BASE, "--", *extra], env=env)
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  assert [c[:5] for c in cmds] == [
      ["gcloud", "compute", "tpus", "tpu-vm", "create"],
      ["git", "-C", str(REPO), "archive", "--format=tar.gz"],
      ["gcloud", "compute", "tpus", "tpu-vm", "scp"],
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],   # unpack the code
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],   # install
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],   # run
  ]
  create, archive, scp, unpack, install, launch = cmds
  assert create == ["gcloud", "compute", "tpus", "tpu-vm", "create", "oj-e1",
                    "--zone=us-central2-b", "--accelerator-type=v4-32",
                    "--version=tpu-ubuntu2204-base"]
  tarball = str(pathlib.Path(env["TMPDIR"]) / "orthojax-oj-e1.tar.gz")
  assert archive[-3:] == ["-o", tarball, "HEAD"]
  assert scp[5:] == [tarball, "oj-e1:orthojax-src.tar.gz", "--zone=us-central2-b", "--worker=all"]
  for ssh in (unpack, install, launch):
    assert ssh[5:8] == ["oj-e1", "--zone=us-central2-b", "--worker=all"]
  assert "tar -xzf ~/orthojax-src.tar.gz -C ~" in _remote(unpack)

  setup = _remote(install)
  assert "uv venv --quiet --seed --python 3.11 ~/orthojax-venv" in setup
  pip_jax = "~/orthojax-venv/bin/pip install --quiet -c ~/orthojax/constraints.txt 'jax[tpu]'"
  pip_self = "~/orthojax-venv/bin/pip install --quiet -c ~/orthojax/constraints.txt -e ~/orthojax"
  assert setup.index(pip_jax) < setup.index(pip_self)

  remote = _remote(launch)
  assert f"export TFDS_DATA_DIR={TFDS}" in remote
  assert remote.index("export TFDS_DATA_DIR") < remote.index("nohup")
  words = _words(remote)
  start = words.index("nohup")
  train = words[start + 1:words.index(">>", start)]
  assert train == ["~/orthojax-venv/bin/python", "-m", "experiments.train",
                   f"--flagfile={FLAGFILE}", f"--workdir={WORKDIR}", "--distributed", *extra]
  assert words[words.index(">>", start) + 1] == "~/orthojax-run.log"
  assert "echo $! > ~/orthojax-run.pid" in remote
  # How to follow and to delete, and nothing was executed.
  assert "tail -n 100 -f ~/orthojax-run.log" in proc.stdout
  assert "gcloud compute tpus tpu-vm delete oj-e1 --zone=us-central2-b --quiet" in proc.stdout
  assert not log.exists()
  assert not pathlib.Path(tarball).exists()


def test_tpu_reuse_skips_create():
  proc = _bash(TPU, ["--dry-run", "--reuse", *BASE])
  assert proc.returncode == 0, proc.stderr
  verbs = [c[4] for c in _commands(proc.stdout) if c[0] == "gcloud"]
  assert "create" not in verbs
  assert verbs[0] == "describe" and verbs[-1] == "ssh"


def test_tpu_code_copy_archives_and_scps_to_all_workers():
  proc = _bash(TPU, ["--dry-run", "--code=copy", *BASE])
  cmds = _commands(proc.stdout)
  assert any(c[:2] == ["git", "-C"] and "archive" in c for c in cmds)
  scp = [c for c in cmds if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]]
  assert len(scp) == 1 and "--worker=all" in scp[0]


@pytest.mark.parametrize("spec,url,ref", [
    ("pull:https://github.com/org/orthojax.git@v0.1", "https://github.com/org/orthojax.git", "v0.1"),
    ("pull:https://github.com/org/orthojax.git", "https://github.com/org/orthojax.git", "HEAD"),
    ("pull:git@github.com:org/orthojax.git", "git@github.com:org/orthojax.git", "HEAD"),
    ("pull:git@github.com:org/orthojax.git@feature/x", "git@github.com:org/orthojax.git",
     "feature/x"),
    ("pull:https://tok@example.com/orthojax.git", "https://tok@example.com/orthojax.git", "HEAD"),
])
def test_tpu_code_pull_clones_and_checks_out_the_ref(spec, url, ref):
  proc = _bash(TPU, ["--dry-run", f"--code={spec}", *BASE])
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  assert not any(c[0] == "git" or "scp" in c for c in cmds)
  fetch = _words(_remote(cmds[1]))
  assert fetch[fetch.index("clone") + 2] == url
  assert fetch[fetch.index("fetch") + 1:fetch.index("fetch") + 5] == [
      "--quiet", "--tags", "origin", ref]
  assert "FETCH_HEAD" in fetch


def test_tpu_queued_spot_project_and_delete_after():
  proc = _bash(TPU, ["--dry-run", "--queued", "--spot", "--project=my-proj", "--delete-after",
                     "--name=oj-e1", "--zone=us-west4-a", "--accelerator=v5litepod-64",
                     f"--flagfile={FLAGFILE}", f"--workdir={WORKDIR}"])
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  assert cmds[0] == ["gcloud", "compute", "tpus", "queued-resources", "create", "oj-e1",
                     "--node-id=oj-e1", "--zone=us-west4-a", "--project=my-proj",
                     "--accelerator-type=v5litepod-64", "--runtime-version=v2-alpha-tpuv5-lite",
                     "--spot"]
  assert cmds[1][:6] == ["gcloud", "compute", "tpus", "queued-resources", "describe", "oj-e1"]
  assert all("--project=my-proj" in c for c in cmds if c[0] == "gcloud")
  # Without --tfds_data_dir nothing is exported.
  assert "TFDS_DATA_DIR" not in _remote(cmds[-4])
  # Wait for the run (poll), show the log tail, then delete the queued resource.
  assert "kill -0" in _remote(cmds[-3])
  assert "tail -n 30" in _remote(cmds[-2])
  assert cmds[-1] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "oj-e1",
                      "--zone=us-west4-a", "--project=my-proj", "--force", "--quiet"]


@pytest.mark.parametrize("accelerator,version", [
    ("v4-8", "tpu-ubuntu2204-base"), ("v5p-16", "v2-alpha-tpuv5"),
    ("v5litepod-8", "v2-alpha-tpuv5-lite"), ("v6e-16", "v2-alpha-tpuv6e"),
])
def test_tpu_default_runtime_per_family(accelerator, version):
  args = [a for a in BASE if not a.startswith("--accelerator")]
  proc = _bash(TPU, ["--dry-run", f"--accelerator={accelerator}", *args])
  assert proc.returncode == 0, proc.stderr
  assert f"--version={version}" in _commands(proc.stdout)[0]
  proc = _bash(TPU, ["--dry-run", f"--accelerator={accelerator}", "--version=custom-rt", *args])
  assert "--version=custom-rt" in _commands(proc.stdout)[0]


def test_tpu_single_host_accepts_a_local_workdir_with_a_warning():
  args = [a for a in BASE if not a.startswith(("--accelerator", "--workdir"))]
  proc = _bash(TPU, ["--dry-run", "--accelerator=v4-8", "--workdir=/tmp/run", *args])
  assert proc.returncode == 0, proc.stderr
  assert "lost when the slice is deleted" in proc.stderr


@pytest.mark.parametrize("drop,flag", [
    ("--name", "--name"), ("--zone", "--zone"), ("--accelerator", "--accelerator"),
    ("--flagfile", "--flagfile"), ("--workdir", "--workdir"),
])
def test_tpu_missing_required_flag_is_a_one_line_error(drop, flag):
  args = [a for a in BASE if not a.startswith(drop + "=")]
  proc = _bash(TPU, ["--dry-run", *args])
  assert proc.returncode != 0
  _one_error(proc.stderr, flag)
  assert proc.stderr.count("\n") == 1  # that line and nothing else
  assert not _commands(proc.stdout)


@pytest.mark.parametrize("args,flag", [
    (["--workdir=/home/me/run"], "--workdir"),           # multi-host needs gs://
    (["--code=rsync"], "--code"),
    (["--code=pull:"], "--code"),
    (["--accelerator=tpu-32"], "--accelerator"),
    (["--name=Bad_Name"], "--name"),
    (["--experiment=../x"], "--experiment"),
    (["--bogus=1"], "--bogus"),
    (["--zone=US Central"], "--zone"),
    (["--python=three"], "--python"),
])
def test_tpu_bad_values_are_one_line_errors_naming_the_flag(args, flag):
  keys = {a.split("=", 1)[0] for a in args}
  base = [a for a in BASE if a.split("=", 1)[0] not in keys]
  proc = _bash(TPU, ["--dry-run", *base, *args])
  assert proc.returncode != 0
  _one_error(proc.stderr, flag)
  assert proc.stderr.count("\n") == 1  # errors come before any warning
  assert not _commands(proc.stdout)


# ------------------------------------------------ tpu for real, fake gcloud

@pytest.fixture
def fake_tpu(tmp_path):
  """A fake gcloud + two simulated workers whose HOMEs receive the code."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  workers = [tmp_path / "w0", tmp_path / "w1"]
  for w in workers:
    (w / "orthojax-venv" / "bin").mkdir(parents=True)
    # The venv's python/pip record what they are asked to do.
    _write_exe(w / "orthojax-venv" / "bin" / "python", """
        #!/usr/bin/env bash
        { echo "cwd=$PWD"; echo "TFDS_DATA_DIR=${TFDS_DATA_DIR:-}";
          echo "JAX_PLATFORMS=${JAX_PLATFORMS:-}"; printf 'arg=%s\\n' "$@"; } > "$HOME/train.tmp"
        mv "$HOME/train.tmp" "$HOME/train.txt"
        """)
    _write_exe(w / "orthojax-venv" / "bin" / "pip", """
        #!/usr/bin/env bash
        echo "$*" >> "$HOME/pip.txt"
        """)
  _write_exe(bin_dir / "uv", "#!/usr/bin/env bash\nexit 0\n")
  # The local compile check's python records its arguments (a real one compiles E1's
  # ResNet-50 for the slice: minutes; test_tpu_compile_check_for_real runs a small job).
  _write_exe(bin_dir / "local-python", f"""
      #!/usr/bin/env bash
      printf 'arg=%s\\n' "$@" > {tmp_path}/compile_check.txt
      """)
  _write_exe(bin_dir / "gcloud", f"""
      #!/usr/bin/env bash
      # gcloud compute tpus (tpu-vm|queued-resources) VERB NAME [flags]
      echo "$3 $4" >> {tmp_path}/gcloud.log
      case "$3 $4" in
        "tpu-vm describe") echo READY ;;
        "queued-resources describe") echo ACTIVE ;;
        "tpu-vm scp") for w in {workers[0]} {workers[1]}; do cp "$5" "$w/${{6#*:}}"; done ;;
        "tpu-vm ssh")
          cmd="" worker=""
          for a in "$@"; do
            case $a in --command=*) cmd=${{a#--command=}} ;; --worker=*) worker=${{a#--worker=}} ;; esac
          done
          if [ "$worker" = all ]; then targets="0 1"; else targets=$worker; fi
          rc=0
          for i in $targets; do
            (cd {tmp_path}/w$i && HOME={tmp_path}/w$i bash -c "$cmd") || rc=1
          done
          exit $rc ;;
      esac
      """)
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path),
         "TPU_POD_POLL_SECONDS": "0", "ORTHOJAX_PYTHON": str(bin_dir / "local-python")}
  return env, workers, tmp_path / "gcloud.log"


def _wait_for(path: pathlib.Path, seconds: float = 20.0) -> str:
  """The fake python runs in the background (nohup ... &); it writes then renames."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if path.exists():
      return path.read_text()
    time.sleep(0.05)
  raise AssertionError(f"{path} never written")


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="--code=copy archives a git checkout")
def test_tpu_real_run_executes_remote_commands_on_every_worker(fake_tpu):
  env, workers, gcloud_log = fake_tpu
  proc = _bash(TPU, [*BASE, "--", "--config.batch_size=1024", "--note=it's a test"], env=env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert gcloud_log.read_text().split("\n")[:2] == ["tpu-vm create", "tpu-vm scp"]
  check = (gcloud_log.parent / "compile_check.txt").read_text().splitlines()
  assert check == [f"arg={a}" for a in (
      "-m", "experiments.train", f"--flagfile={FLAGFILE}", "--compile_for=v4:2x2x4",
      f"--workdir={gcloud_log.parent}/orthojax-oj-e1-compile", "--config.batch_size=1024",
      "--note=it's a test")]
  for w in workers:
    assert (w / "orthojax" / "experiments" / "train.py").exists()
    pip = (w / "pip.txt").read_text().splitlines()
    assert pip[0].endswith("constraints.txt jax[tpu]")
    assert pip[1].endswith(f"-e {w}/orthojax")
    out = _wait_for(w / "train.txt")
    assert f"cwd={w}/orthojax" in out
    assert f"TFDS_DATA_DIR={TFDS}" in out and "JAX_PLATFORMS=tpu,cpu" in out
    args = [line[4:] for line in out.splitlines() if line.startswith("arg=")]
    assert args == ["-m", "experiments.train", f"--flagfile={FLAGFILE}", f"--workdir={WORKDIR}",
                    "--distributed", "--config.batch_size=1024", "--note=it's a test"]
    assert (w / "orthojax-run.pid").read_text().strip().isdigit()
    assert "launch on" in (w / "orthojax-run.log").read_text()


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="--code=copy archives a git checkout")
def test_tpu_refuses_to_start_over_a_live_run(fake_tpu):
  env, workers, _ = fake_tpu
  sleeper = subprocess.Popen(["sleep", "60"])
  try:
    (workers[1] / "orthojax-run.pid").write_text(f"{sleeper.pid}\n")
    proc = _bash(TPU, ["--reuse", *BASE], env=env)
    assert proc.returncode != 0
    assert "already going" in proc.stderr
    assert not (workers[0] / "train.txt").exists()
  finally:
    sleeper.send_signal(signal.SIGTERM)
    sleeper.wait()


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="--code=copy archives a git checkout")
def test_tpu_delete_after_waits_then_deletes(fake_tpu):
  env, workers, gcloud_log = fake_tpu
  proc = _bash(TPU, ["--reuse", "--delete-after", *BASE], env=env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  calls = gcloud_log.read_text().split()
  assert calls[0:2] == ["tpu-vm", "describe"] and "create" not in calls
  assert gcloud_log.read_text().splitlines()[-1] == "tpu-vm delete"
  _wait_for(workers[0] / "train.txt")


# ------------------------------------------------------------------- slurm

@pytest.fixture
def slurm(tmp_path):
  """A fake scontrol (and srun that runs each task here) plus SLURM variables."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  _write_exe(bin_dir / "scontrol", """
      #!/usr/bin/env bash
      [ "$1 $2" = "show hostnames" ] || exit 1
      [ "$3" = "gpu[017-018]" ] && { echo gpu017; echo gpu018; exit 0; }
      echo "$3" | tr , '\\n'
      """)
  _write_exe(bin_dir / "srun", """
      #!/usr/bin/env bash
      # Run every task of the step here, one after the other.
      ntasks=1
      while [ $# -gt 0 ]; do
        case $1 in --ntasks=*) ntasks=${1#--ntasks=}; shift ;; --*) shift ;; *) break ;; esac
      done
      for ((i = 0; i < ntasks; i++)); do
        SLURM_PROCID=$i SLURM_LOCALID=0 "$@" || exit 1
      done
      """)
  fake_python = _write_exe(tmp_path / "python", """
      #!/usr/bin/env bash
      i=${SLURM_PROCID}
      { echo "JAX_LOCAL_DEVICE_IDS=${JAX_LOCAL_DEVICE_IDS:-}"; echo "XLA_FLAGS=${XLA_FLAGS:-}";
        echo "TFDS_DATA_DIR=${TFDS_DATA_DIR:-}"; printf 'arg=%s\\n' "$@"; } > "$OUT_DIR/task$i.txt"
      """)
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
         "SLURM_JOB_NODELIST": "gpu[017-018]", "SLURM_NNODES": "2", "SLURM_PROCID": "0",
         "SLURM_GPUS_PER_NODE": "a100:8", "SLURM_CPUS_ON_NODE": "64", "OUT_DIR": str(tmp_path),
         "PYTHON": str(fake_python)}
  for var in ("XLA_FLAGS", "GPU_XLA_FLAGS", "COORDINATOR_PORT", "JAX_LOCAL_DEVICE_IDS",
              "SLURM_SUBMIT_DIR", "REPO_DIR", "DRY_RUN", "CUDA_VISIBLE_DEVICES"):
    env[var] = ""
  return env, tmp_path


def _clean(env):
  """Empty strings in the fixture mean 'unset'."""
  out = {k: v for k, v in os.environ.items()}
  for k, v in env.items():
    if v == "":
      out.pop(k, None)
    else:
      out[k] = v
  return out


def _run_slurm(args, env, **kw):
  return subprocess.run(["bash", str(GPU), *args], capture_output=True, text=True,
                        env=_clean(env), cwd=REPO, timeout=60, **kw)


GPU_ARGS = [f"--flagfile={FLAGFILE}", "--workdir=/shared/runs/e1", "--tfds_data_dir=/shared/tfds"]


def test_slurm_dry_run_explicit_coordinator_and_process_count(slurm):
  env, _ = slurm
  env = {**env, "DRY_RUN": "1", "SLURM_PROCID": "1"}
  proc = _run_slurm([*GPU_ARGS, "--", "--config.batch_size=1024",
                     "--config.optimizer.learning_rate=0.4"], env)
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  assert ["export", "TFDS_DATA_DIR=/shared/tfds"] in cmds
  assert ["export", "TF_FORCE_GPU_ALLOW_GROWTH=true"] in cmds
  assert ["export", "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true"] in cmds
  srun = cmds[-1]
  assert srun[:7] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                      "--gpus-per-node=8", "--cpus-per-task=64", "--kill-on-bad-exit=1"]
  train = srun[srun.index("orthojax-task") + 1:]
  assert train == [env["PYTHON"], "-m", "experiments.train", f"--flagfile={FLAGFILE}",
                   "--workdir=/shared/runs/e1", "--coordinator_address=gpu017:29742",
                   "--num_processes=2", "--config.batch_size=1024",
                   "--config.optimizer.learning_rate=0.4"]
  assert '--process_id="$SLURM_PROCID"' in srun[srun.index("-c") + 1]
  task_line = [line for line in proc.stdout.splitlines() if line.startswith("# task ")]
  assert task_line and task_line[0].endswith(
      "--config.optimizer.learning_rate=0.4 --process_id=1")
  assert not (slurm[1] / "task0.txt").exists()


def test_slurm_port_override_and_auto_mode(slurm):
  env, _ = slurm
  env = {**env, "DRY_RUN": "1"}
  proc = _run_slurm(["--port=12345", *GPU_ARGS], env)
  assert "--coordinator_address=gpu017:12345" in _commands(proc.stdout)[-1]
  proc = _run_slurm(["--mode=auto", "--port=12345", *GPU_ARGS], env)
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  srun = cmds[-1]
  assert srun[1:5] == ["--nodes=2", "--ntasks=16", "--ntasks-per-node=8", "--gpus-per-node=8"]
  assert "--distributed" in srun and not any("coordinator" in a for a in srun)
  assert ["export", "JAX_COORDINATOR_PORT=12345"] in cmds


def test_slurm_real_run_gives_each_task_its_id_and_all_node_gpus(slurm):
  env, out = slurm
  env = {**env, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  proc = _run_slurm([*GPU_ARGS, "--", "--config.num_epochs=1"], env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  for i in range(2):
    text = (out / f"task{i}.txt").read_text()
    assert "JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7" in text
    assert ("XLA_FLAGS=--xla_dump_to=/tmp/x --xla_gpu_enable_latency_hiding_scheduler=true"
            in text)
    assert "TFDS_DATA_DIR=/shared/tfds" in text
    args = [line[4:] for line in text.splitlines() if line.startswith("arg=")]
    assert args[-4:] == ["--coordinator_address=gpu017:29742", "--num_processes=2",
                         "--config.num_epochs=1", f"--process_id={i}"]


@pytest.mark.parametrize("drop,needle", [
    ("SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST"), ("SLURM_NNODES", "SLURM_NNODES"),
])
def test_slurm_outside_a_job_is_a_clear_error(slurm, drop, needle):
  env, _ = slurm
  env = {**env, "DRY_RUN": "1", drop: ""}
  proc = _run_slurm(GPU_ARGS, env)
  assert proc.returncode != 0
  _one_error(proc.stderr, needle)


@pytest.mark.parametrize("args,flag", [
    (GPU_ARGS[1:], "--flagfile"), (GPU_ARGS[:1], "--workdir"),
    ([*GPU_ARGS, "--mode=mpi"], "--mode"), ([*GPU_ARGS, "--port=http"], "--port"),
])
def test_slurm_bad_flags_are_one_line_errors(slurm, args, flag):
  env, _ = slurm
  proc = _run_slurm(args, {**env, "DRY_RUN": "1"})
  assert proc.returncode != 0
  _one_error(proc.stderr, flag)


def test_slurm_auto_mode_needs_gpus_per_node(slurm):
  env, _ = slurm
  env = {**env, "DRY_RUN": "1", "SLURM_GPUS_PER_NODE": "", "SLURM_GPUS_ON_NODE": ""}
  proc = _run_slurm(["--mode=auto", *GPU_ARGS], env)
  assert proc.returncode != 0 and "--gpus-per-node" in proc.stderr


# ---------------------------------------------------------- compile check

@pytest.mark.parametrize("accelerator,topology", [
    ("v4-32", "v4:2x2x4"), ("v4-8", "v4:2x2x1"), ("v5p-16", "v5p:2x2x2"),
    ("v5litepod-64", "v5e:8x8"), ("v5litepod-16", "v5e:4x4"), ("v6e-8", "v6e:2x4")])
def test_tpu_dry_run_compiles_for_the_slice_first(no_gcloud, accelerator, topology):
  env, log = no_gcloud
  args = [a for a in BASE if not a.startswith("--accelerator")]
  proc = _bash(TPU, ["--dry-run", f"--accelerator={accelerator}", *args, "--",
                     "--config.optimizer.learning_rate=0.4"], env=env)
  assert proc.returncode == 0, proc.stderr
  first, second = _commands(proc.stdout, compile_check=True)[:2]
  assert first[1:] == ["-m", "experiments.train", f"--flagfile={FLAGFILE}",
                       f"--compile_for={topology}",
                       f"--workdir={env['TMPDIR']}/orthojax-oj-e1-compile",
                       "--config.optimizer.learning_rate=0.4"]
  assert second[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]
  assert not log.exists()


def test_tpu_topology_override_skip_and_unknown_sizes(no_gcloud):
  env, _ = no_gcloud
  proc = _bash(TPU, ["--dry-run", *BASE, "--topology=v5e:2x2"], env=env)
  assert "--compile_for=v5e:2x2" in proc.stdout
  proc = _bash(TPU, ["--dry-run", *BASE, "--skip-compile-check"], env=env)
  assert proc.returncode == 0 and "--compile_for" not in proc.stdout
  args = [a for a in BASE if not a.startswith("--accelerator")]
  proc = _bash(TPU, ["--dry-run", "--accelerator=v5litepod-12", *args], env=env)
  assert proc.returncode == 2
  _one_error(proc.stderr, "--topology")


def test_tpu_failed_compile_check_creates_nothing(fake_tpu):
  env, _, gcloud_log = fake_tpu
  failing = pathlib.Path(env["TMPDIR"]) / "bin" / "failing-python"
  _write_exe(failing, "#!/usr/bin/env bash\necho 'error: --compile_for=v4:2x2x4: too big' >&2\n"
                      "exit 1\n")
  proc = _bash(TPU, BASE, env={**env, "ORTHOJAX_PYTHON": str(failing)})
  assert proc.returncode == 2
  assert "compile check" in proc.stderr and "nothing was created" in proc.stderr
  assert not gcloud_log.exists()


def test_tpu_compile_check_for_real(fake_tpu):
  """The real local python compiles a small job for v5e:2x2 before creating the slice."""
  env, _, gcloud_log = fake_tpu
  env = {**env, "ORTHOJAX_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
  args = [a for a in BASE if not a.startswith("--accelerator")]
  # The flagfile's E1 config replaced by experiments.train's, an MLP on digits (no
  # --config.* overrides: ml_collections cannot take them along with a second --config).
  small = ["--config=experiments/configs/train.py"]
  proc = _bash(TPU, ["--accelerator=v5litepod-4", *args, "--", *small], env=env, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "HBM per chip" in proc.stdout
  report = pathlib.Path(env["TMPDIR"]) / "orthojax-oj-e1-compile" / "compile_report.json"
  assert report.exists()
  assert gcloud_log.read_text().startswith("tpu-vm create")


def test_slurm_requeues_a_preempted_run(slurm):
  """The trainer exits 75 after saving at preemption: the job is requeued; other
  failures pass their status through untouched."""
  env, out = slurm
  bin_dir = out / "bin"
  _write_exe(bin_dir / "srun", """
      #!/usr/bin/env bash
      while [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done
      SLURM_PROCID=0 SLURM_LOCALID=0 "$@"
      """)
  scontrol = (bin_dir / "scontrol").read_text()
  _write_exe(bin_dir / "scontrol", scontrol.replace(
      '[ "$1 $2" = "show hostnames" ] || exit 1',
      '[ "$1" = requeue ] && { echo "requeue $2" >> "$OUT_DIR/scontrol.log"; exit 0; }\n'
      '[ "$1 $2" = "show hostnames" ] || exit 1'))
  for status, requeued in ((75, True), (1, False), (0, False)):
    _write_exe(out / "python", f"#!/usr/bin/env bash\nexit {status}\n")
    (out / "scontrol.log").unlink(missing_ok=True)
    proc = _run_slurm(GPU_ARGS, env)
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert (out / "scontrol.log").exists() == requeued
    if requeued:
      assert (out / "scontrol.log").read_text().split() == ["requeue", "4242"]
