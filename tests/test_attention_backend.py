"""The host's choice of attention kernels on CUDA (modules/attention_backend.py): cuDNN's backend off
unless --cudnn-attention, and torch's switch left alone where the model runs without CUDA."""
import pytest
import torch

from modules import attention_backend, shared


@pytest.fixture
def cudnn_switch():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize("argv, kept", [([], False), (["--cudnn-attention"], True)])
def test_cuda_turns_cudnn_attention_off_unless_kept(monkeypatch, cudnn_switch, argv, kept):
    monkeypatch.setattr(shared, "args", shared.parse_args(argv))
    torch.backends.cuda.enable_cudnn_sdp(not kept)
    attention_backend.choose(on_cuda=True)
    assert torch.backends.cuda.cudnn_sdp_enabled() is kept


@pytest.mark.parametrize("before", [True, False])
def test_without_cuda_the_switch_stays(monkeypatch, cudnn_switch, before):
    monkeypatch.setattr(shared, "args", shared.parse_args([]))
    torch.backends.cuda.enable_cudnn_sdp(before)
    attention_backend.choose(on_cuda=False)
    assert torch.backends.cuda.cudnn_sdp_enabled() is before
