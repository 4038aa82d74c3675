"""slurm_script's text for a CPU node and for GPU nodes, without a SLURM (tests/topics/test_slurm.py
submits it to a real one)."""
import shutil
import subprocess

import pytest

from course_lib.topics.cluster import slurm_script


def test_gpu_nodes_ask_for_gpus_and_start_one_rank_per_gpu():
    script = slurm_script("train.py", nodes=2, gpus_per_node=4, cpus_per_task=16)
    assert "#SBATCH --gpus-per-node=4" in script and "--nproc_per_node=4" in script
    assert "export OMP_NUM_THREADS=4" in script


def test_a_cpu_node_asks_for_no_gpu_and_needs_its_ranks_per_node():
    script = slurm_script("train.py", nodes=1, gpus_per_node=0, nproc_per_node=2, cpus_per_task=2)
    assert "gpus" not in script and "--nproc_per_node=2" in script and "OMP_NUM_THREADS=1" in script
    with pytest.raises(ValueError, match="needs nproc_per_node"):
        slurm_script("train.py", gpus_per_node=0)


def test_srun_gets_the_cpus_per_task_back_before_it_starts_torchrun():
    lines = slurm_script("train.py").splitlines()
    exported = lines.index("export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK")
    assert exported < lines.index("srun torchrun \\")  # srun reads it when it starts


def test_requeue_appends_the_log_of_every_run_to_one_file():
    script = slurm_script("train.py", requeue=True, output="logs/%x-%j.out")
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in script
    assert "#SBATCH --output=logs/%x-%j.out" in script
    assert "--requeue" not in slurm_script("train.py")
    if shutil.which("bash"):
        checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
