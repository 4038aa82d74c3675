"""amp="auto" chooses by the device's capability: bf16 where it runs natively, fp16 + GradScaler before.

No GPU is needed: the tests fake the CUDA capability that torch.cuda.get_device_capability reports.
"""
import warnings

import pytest
import torch

from course_lib import TrainConfig, Trainer, make_dataset, make_model
from course_lib.training.amp import AMP_MODES, Precision, choose_amp, has_native_bf16

GPUS = [  # (what, compute capability, the mode amp="auto" picks)
    ("Pascal, GTX 1080 (sm_61): fp16 at 1/64 of fp32", (6, 1), "fp16"),
    ("Volta, V100: fp16 tensor cores", (7, 0), "fp16"),
    ("Turing, T4: fp16 tensor cores", (7, 5), "fp16"),
    ("Ampere, A100", (8, 0), "bf16"),
    ("Ampere, RTX 3090", (8, 6), "bf16"),
    ("Hopper, H100 and H200", (9, 0), "bf16"),
    ("Blackwell, B200", (10, 0), "bf16"),
]


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(capability): torch reports a CUDA GPU of this compute capability (no ROCm)."""
    def fake(capability):
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return fake


@pytest.mark.parametrize("what, capability, mode", GPUS, ids=[gpu[0] for gpu in GPUS])
def test_auto_picks_bf16_from_ampere_on_and_fp16_before(fake_gpu, what, capability, mode):
    fake_gpu(capability)
    assert has_native_bf16(torch.device("cuda", 0)) == (mode == "bf16")
    assert choose_amp(torch.device("cuda", 0)) == mode


def test_auto_picks_bf16_on_the_cpu_and_on_rocm(monkeypatch):
    assert choose_amp(torch.device("cpu")) == "bf16" and choose_amp("cpu") == "bf16"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    assert choose_amp(torch.device("cuda", 0)) == "bf16"


def test_precision_resolves_auto(fake_gpu):
    cpu = Precision("auto", torch.device("cpu"), make_model())
    assert cpu.amp == "bf16" and cpu.scaler is None
    fake_gpu((7, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA, GradScaler("cuda") warns and disables itself
        v100 = Precision("auto", torch.device("cuda", 0), make_model())
    assert v100.amp == "fp16" and v100.scaler is not None
    fake_gpu((9, 0))
    h100 = Precision("auto", torch.device("cuda", 0), make_model())
    assert h100.amp == "bf16" and h100.scaler is None


def test_trainer_and_cli_accept_auto():
    assert "auto" in AMP_MODES
    config = TrainConfig(batch_size=16, epochs=2, lr=0.3, amp="auto", progress=False)
    history = Trainer(make_model(), make_dataset(128), config).fit()
    assert history.losses[-1] < history.losses[0] and history.skipped_steps == 0
