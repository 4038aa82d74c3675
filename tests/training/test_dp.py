"""course_lib.training.dp: DataParallel's flow matches one device computing the whole batch."""
import threading

import pytest
import torch
from torch import nn

from course_lib.training.dp import DataParallel, ReplicaError, gather, parallel_apply, replicate, scatter

CPU = torch.device("cpu")


def make_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def grads(module):
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("device_count, batch_size, chunk_sizes",
                         [(2, 8, [4, 4]), (2, 7, [4, 3]), (3, 7, [3, 3, 1]), (3, 10, [4, 4, 2])])
def test_outputs_and_gradients_equal_a_single_device_run(device_count, batch_size, chunk_sizes):
    single, wrapped = make_net(), make_net()
    dp = DataParallel(wrapped, devices=["cpu"] * device_count)
    X = torch.randn(batch_size, 5, dtype=torch.float64)
    y = torch.randn(batch_size, 3, dtype=torch.float64)
    X_single, X_dp = X.clone().requires_grad_(), X.clone().requires_grad_()

    out_single, out_dp = single(X_single), dp(X_dp)
    nn.functional.mse_loss(out_single, y).backward()
    nn.functional.mse_loss(out_dp, y).backward()

    torch.testing.assert_close(out_dp, out_single)
    for grad_dp, grad_single in zip(grads(wrapped), grads(single)):
        torch.testing.assert_close(grad_dp, grad_single)
    torch.testing.assert_close(X_dp.grad, X_single.grad)  # gradients flow back through scatter
    assert dp.last_forward.chunk_sizes == chunk_sizes
    assert dp.last_forward.devices == ["cpu"] * len(chunk_sizes)
    assert dp.module is wrapped


def test_default_devices_without_gpu_are_two_cpus():
    if torch.cuda.is_available():
        pytest.skip("with GPUs the default is every GPU")
    assert DataParallel(make_net()).devices == [CPU, CPU]


def test_replicas_run_at_the_same_time_in_their_own_threads():
    all_replicas_running = threading.Barrier(3, timeout=10)  # breaks unless 3 threads wait at once
    thread_names = []

    class WaitForTheOthers(nn.Module):
        def forward(self, x):
            thread_names.append(threading.current_thread().name)
            all_replicas_running.wait()
            return x

    DataParallel(WaitForTheOthers(), devices=["cpu"] * 3)(torch.zeros(6, 1))
    assert len(set(thread_names)) == 3
    assert threading.current_thread().name not in thread_names


def test_nested_inputs_kwargs_and_objects_are_scattered():
    class Nested(nn.Module):
        def forward(self, pair, features, scale, shift=None):
            first, second = pair
            return {"sum": (first + second + features["x"]) * scale + shift, "rows": first.shape[0]}

    a, b, x, shift = (torch.randn(5, 2) for _ in range(4))
    dp = DataParallel(Nested(), devices=["cpu", "cpu"])
    out = dp((a, b), {"x": x}, 2.0, shift=shift)
    torch.testing.assert_close(out["sum"], (a + b + x) * 2.0 + shift)
    assert out["rows"] == [3, 2]  # a non-tensor output comes back as one value per replica
    assert dp.last_forward.chunk_sizes == [3, 2]


def test_scatter_chunks_like_nn_data_parallel():
    chunks = scatter((torch.arange(5), [torch.arange(5)], "tag"), [CPU, CPU])
    assert [c[0].tolist() for c in chunks] == [[0, 1, 2], [3, 4]]
    assert [c[1][0].tolist() for c in chunks] == [[0, 1, 2], [3, 4]]
    assert [c[2] for c in chunks] == ["tag", "tag"]
    assert scatter("only an object", [CPU] * 3) == ["only an object"] * 3


def test_custom_scatter_for_inputs_that_are_not_tensors():
    class SumGraphs(nn.Module):  # a "graph" is a variable-length tensor of node features
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(1, dtype=torch.float64))

        def forward(self, graphs):
            return torch.stack([g.sum() * self.weight[0] for g in graphs])

    def split_graphs(inputs, devices):
        (graphs,) = inputs
        per_device = (len(graphs) + len(devices) - 1) // len(devices)
        return [([g.to(d) for g in graphs[i * per_device:(i + 1) * per_device]],)
                for i, d in enumerate(devices) if graphs[i * per_device:]]

    # node counts unlike the chunk sizes, so counting nodes instead of graphs would show
    graphs = [torch.randn(n, dtype=torch.float64) for n in (5, 1, 4, 6, 2)]
    module = SumGraphs()
    dp = DataParallel(module, devices=["cpu", "cpu"], scatter_fn=split_graphs)
    dp(graphs).sum().backward()
    torch.testing.assert_close(module.weight.grad, sum(g.sum() for g in graphs).reshape(1))
    assert dp.last_forward.chunk_sizes == [3, 2]


def test_a_batch_smaller_than_the_device_count_uses_fewer_replicas():
    net = make_net()
    dp = DataParallel(net, devices=["cpu"] * 4)
    X = torch.randn(2, 5, dtype=torch.float64)
    torch.testing.assert_close(dp(X), net(X))
    assert dp.last_forward.chunk_sizes == [1, 1]
    assert len(dp.last_forward.devices) == 2


def test_grad_mode_reaches_the_replica_threads():
    dp = DataParallel(make_net(), devices=["cpu", "cpu"])
    with torch.no_grad():
        assert not dp(torch.randn(4, 5, dtype=torch.float64)).requires_grad


def test_only_the_first_replica_updates_buffers_as_in_nn_data_parallel():
    bn = nn.BatchNorm1d(2)
    X = torch.randn(6, 2)
    DataParallel(bn, devices=["cpu", "cpu"])(X)
    reference = nn.BatchNorm1d(2)
    reference(X[:3])
    torch.testing.assert_close(bn.running_mean, reference.running_mean)


def test_the_four_steps_compose_by_hand():
    net = make_net()
    X = torch.randn(5, 5, dtype=torch.float64)
    chunks = scatter((X,), [CPU, CPU])
    outputs = parallel_apply(replicate(net, [CPU, CPU]), chunks, [CPU, CPU])
    torch.testing.assert_close(gather(outputs, CPU), net(X))
    with pytest.warns(UserWarning, match="one value per replica"):
        assert gather([torch.tensor(1.0), torch.tensor(2.0)], CPU).tolist() == [1.0, 2.0]


def test_an_exception_in_a_replica_names_its_device():
    class FailOnSmallChunk(nn.Module):
        def forward(self, x):
            if x.shape[0] < 3:
                raise ValueError("chunk too small")
            return x

    with pytest.raises(ReplicaError, match=r"replica 1 on device cpu raised ValueError") as info:
        DataParallel(FailOnSmallChunk(), devices=["cpu", "cpu"])(torch.zeros(5, 1))
    assert isinstance(info.value.__cause__, ValueError)


def test_scatter_fn_with_the_wrong_number_of_chunks():
    three_chunks = lambda inputs, devices: [inputs] * 3  # noqa: E731
    dp = DataParallel(make_net(), devices=["cpu", "cpu"], scatter_fn=three_chunks)
    with pytest.raises(ValueError, match="scatter_fn returned 3 chunks for 2 devices"):
        dp(torch.zeros(4, 5, dtype=torch.float64))


def test_input_on_a_device_other_than_the_first():
    with pytest.raises(ValueError, match="input tensor is on meta.*devices\\[0\\]=cpu"):
        DataParallel(make_net(), devices=["cpu", "cpu"])(torch.empty(4, 5, device="meta"))


@pytest.mark.parametrize("devices, message", [([], "at least one device"),
                                              (["cpu", "meta"], "mixes device types"),
                                              (["meta"], "runs on 'cuda' or 'cpu'")])
def test_bad_devices(devices, message):
    with pytest.raises(ValueError, match=message):
        DataParallel(make_net(), devices=devices)


def test_module_not_on_the_first_device():
    with pytest.raises(ValueError, match=r"0.weight is on meta; call module.to\('cpu'\)"):
        DataParallel(make_net().to("meta"), devices=["cpu", "cpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without GPUs")
def test_gpus_requested_without_gpus():
    with pytest.raises(ValueError, match="0 GPU\\(s\\) are visible"):
        DataParallel(make_net(), devices=["cuda:0", "cuda:1"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_matches_nn_data_parallel_on_gpus():
    devices = list(range(torch.cuda.device_count()))
    ours, theirs = make_net().cuda(), make_net().cuda()
    X = torch.randn(2 * len(devices) + 1, 5, dtype=torch.float64, device="cuda")
    out_ours = DataParallel(ours, devices=devices)(X)
    out_theirs = nn.DataParallel(theirs, device_ids=devices)(X)
    out_ours.square().sum().backward()
    out_theirs.square().sum().backward()
    torch.testing.assert_close(out_ours, out_theirs)
    for grad_ours, grad_theirs in zip(grads(ours), grads(theirs)):
        torch.testing.assert_close(grad_ours, grad_theirs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_path_on_one_gpu_matches_a_single_device_run():
    single, wrapped = make_net().cuda(), make_net().cuda()
    X = torch.randn(7, 5, dtype=torch.float64)  # on the CPU: scatter moves it
    out = DataParallel(wrapped, devices=["cuda:0"], output_device="cpu")(X)
    out.sum().backward()
    single(X.cuda()).sum().backward()
    assert out.device.type == "cpu"
    for grad_dp, grad_single in zip(grads(wrapped), grads(single)):
        torch.testing.assert_close(grad_dp, grad_single)
