"""The multi-node sbatch examples (scripts/slurm/), run as Slurm would run them, on this machine:
stand-ins for ``srun`` (one task per "node", each with its SLURM_NODEID, all on 127.0.0.1) and
``scontrol`` (the job's node list), two "nodes" of one process each. Also the launcher's refusal
of a multi-node launch without a rendezvous address."""

import json
import os
import subprocess

import pytest

from launch import REPO, env, free_port, snapshot
from tinydata import write_dataset

from llava_norm_demo.synth import build_world

SRUN = """#!/usr/bin/env bash
# stand-in for srun: --nodes=N runs the command once per node, SLURM_NODEID 0..N-1, and fails if any fails
nodes=1
while [[ "$1" == --* ]]; do case "$1" in --nodes=*) nodes=${1#--nodes=};; esac; shift; done
echo "srun --nodes=$nodes $*" >> "$SRUN_LOG"
pids=()
for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
SCONTROL = """#!/usr/bin/env bash
# stand-in for scontrol show hostnames: both "nodes" are this machine
[ "$1 $2" = "show hostnames" ] && printf '127.0.0.1\\n127.0.0.1\\n'
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("slurm")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    data, images = write_dataset(root / "data", n=8, text_only_every=4)
    common = [f"model.vision_tower={tiny_dir}/siglip", f"model.llm={tiny_dir}/llama",
              f"data.mixture=[{{path: {data}, image_folder: {images}}}]", "train.max_steps=2",
              "train.per_device_batch_size=2", "train.save_steps=1", "train.deepspeed=configs/deepspeed/zero2.json"]

    def job_env(**more) -> dict:
        port = free_port()  # _nodes.sh derives the job's port from its id: this id gives a free one
        return {**env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SRUN_LOG": str(root / "srun.log"),
                "SLURM_JOB_ID": str(port - 20000), "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_NUM_NODES": "2",
                "SLURM_SUBMIT_DIR": str(REPO), "GPUS_PER_NODE": "1", "SLURM_GPUS_ON_NODE": "1", **more}

    return root, common, job_env


def _sbatch(script: str, args: list[str], environment: dict) -> subprocess.CompletedProcess:
    """What sbatch runs: the script, from the submit directory, with the job's environment."""
    return subprocess.run(["bash", str(REPO / "scripts/slurm" / script), *args], cwd="/", env=environment,
                          capture_output=True, text=True, timeout=600)


def test_stage1_on_two_nodes_then_a_requeue_of_the_finished_job_changes_nothing(cluster):
    """(A requeue of a killed job is the relaunch of a killed run: tests/test_resume.py's two-node case.)"""
    root, common, job_env = cluster
    out = root / "stage1"
    args = [str(REPO / "configs/tiny/ln_textnorm_gwc/stage1.yaml"), f"train.output_dir={out}", *common]
    done = _sbatch("stage1.sbatch", args, job_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["global_step"] == 2
    record = json.loads((out / "provenance.json").read_text())
    assert record["config"]["world_size"] == 2  # one process on each of two "nodes"
    assert "srun --nodes=2 bash -c" in (root / "srun.log").read_text()
    # requeued: the same job again finds the run complete and writes nothing
    before = snapshot(out)
    again = _sbatch("stage1.sbatch", args, job_env())
    assert again.returncode == 0 and "complete at step 2" in again.stdout + again.stderr
    assert snapshot(out) == before


def test_a_gpus_per_node_left_in_the_environment_that_slurm_contradicts_is_refused(cluster):
    root, common, job_env = cluster
    out = root / "leftover"
    args = [str(REPO / "configs/tiny/ln_textnorm_gwc/stage1.yaml"), f"train.output_dir={out}", *common]
    done = _sbatch("stage1.sbatch", args, job_env(GPUS_PER_NODE="8", SLURM_GPUS_ON_NODE="1"))
    assert done.returncode == 2 and "GPUS_PER_NODE=8" in done.stderr and "gave this job 1 GPUs" in done.stderr, \
        done.stderr
    assert not out.exists()


def test_the_pipeline_on_two_nodes_spans_every_launch(cluster, tiny_dir):
    root, common, job_env = cluster
    world = root / "world"
    build_world(world, seed=5, n_pretrain=10, n_instruct=10, n_text=20, n_bench=4, bench_sizes={"pope": 2})
    runs = root / "runs"
    log = root / "srun.log"
    log.unlink(missing_ok=True)
    args = ["--runs", str(runs), "--data-root", str(world / "benchmarks"), "--benchmarks", "pope",
            "--eval-arg=--limit=2", "--eval-arg=--max-new-tokens-cap=4", *[f"--stage1={o}" for o in common],
            *[f"--stage2={o}" for o in common], str(REPO / "configs/tiny/ln_textnorm_gwc")]
    done = _sbatch("pipeline.sbatch", args, job_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    launches = log.read_text().splitlines()
    assert len(launches) == 3 and all(line.startswith("srun --nodes=2") for line in launches)  # s1, s2, eval
    for stage in ("stage1", "stage2"):
        record = json.loads((runs / "ln_textnorm_gwc" / stage / "provenance.json").read_text())
        assert record["complete"] and record["config"]["world_size"] == 2
    assert json.loads((runs / "ln_textnorm_gwc/eval/pope.json").read_text())["metrics"]


def test_a_multi_node_launch_without_a_rendezvous_address_is_refused(tmp_path):
    environment = {k: v for k, v in env().items() if k != "MASTER_ADDR"}
    done = subprocess.run(["bash", str(REPO / "scripts/pretrain.sh"), str(REPO / "configs/tiny/none/stage1.yaml")],
                          env={**environment, "NNODES": "2", "GPUS_PER_NODE": "1"}, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "NNODES=2 needs MASTER_ADDR" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())


def test_a_rendezvous_left_in_the_submitting_environment_is_not_the_jobs(tmp_path):
    """sbatch hands the submitting shell's environment on: a MASTER_ADDR or MASTER_PORT left there
    (a login node's) is replaced by the job's own in _nodes.sh, and a one-node launch meets on this
    machine whatever MASTER_ADDR says (the new user's trial: it waited 900 s for another host)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL.replace("127.0.0.1", "nodeA"))
    (bin_dir / "scontrol").chmod(0o755)
    stale = {**env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "MASTER_ADDR": "loginnode", "MASTER_PORT": "29500"}
    sourced = subprocess.run(["bash", "-c", f"source {REPO}/scripts/slurm/_nodes.sh; echo $MASTER_ADDR $MASTER_PORT"],
                             env={**stale, "SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "nodeA,nodeB",
                                  "SLURM_JOB_NUM_NODES": "2"}, capture_output=True, text=True, timeout=60)
    assert sourced.stdout.split() == ["nodeA", str(20000 + 1234)], sourced.stdout + sourced.stderr
    python = tmp_path / "python"  # stands in for the interpreter: prints the launch it was given
    python.write_text('#!/usr/bin/env bash\necho "$@"\n')
    python.chmod(0o755)
    launched = subprocess.run(["bash", str(REPO / "scripts/_launch.sh"), "train", "x.yaml"], capture_output=True,
                              env={**stale, "PYTHON": str(python), "GPUS_PER_NODE": "2", "NNODES": "1"}, text=True,
                              timeout=60)
    assert "--master_addr=127.0.0.1 " in launched.stdout, launched.stdout + launched.stderr
