"""ddnb.memory: measured bytes equal hand counts; ddnb.viz.memory draws them."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from ddnb.memory import SavedActivations, cuda_peak_bytes, model_memory, tensor_bytes  # noqa: E402
from ddnb.models import GPTConfig, gpt, lm_loss, mlp, synthetic_task  # noqa: E402
from ddnb.viz.memory import plot_memory  # noqa: E402

F32 = 4


def linear_stack():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 32), nn.Linear(32, 4))


def test_tensor_bytes_counts_each_storage_once():
    a = torch.zeros(10, 3)                      # 120 bytes
    b = torch.zeros(7, dtype=torch.float64)     # 56 bytes
    assert tensor_bytes([a, b]) == 120 + 56
    assert tensor_bytes([a, a[2:], a.t(), b, b]) == 120 + 56    # views and repeats: one storage each
    assert tensor_bytes([torch.zeros(0), None]) == 0
    assert tensor_bytes([]) == 0


def test_saved_activations_of_a_linear_stack_are_its_inputs():
    model, x = linear_stack(), torch.randn(5, 8)
    with SavedActivations() as act:
        y = model(x)
        # each Linear saves its input for dW = x^T dy (the weights are parameters, not counted)
        assert act.live == 5 * (8 + 16 + 32) * F32
        y.sum().backward()
        assert act.live == 0                    # backward freed the graph
    assert act.peak == 5 * (8 + 16 + 32) * F32


def test_two_forwards_before_one_backward_peak_twice():
    model = linear_stack()
    x1, x2 = torch.randn(5, 8), torch.randn(5, 8)
    with SavedActivations() as act:
        y1 = model(x1)
        one = act.live
        y2 = model(x2)
        assert act.live == act.peak == 2 * one
        (y1.sum() + y2.sum()).backward()
    assert act.live == 0 and act.peak == 2 * one
    act.reset_peak()
    assert act.peak == 0


def test_shared_and_self_saving_ops_count_once_and_are_released():
    # ReLU saves its output, which is also the next Linear's saved input: one storage.
    model, x = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(5, 8)
    with SavedActivations() as act:
        y = model(x)
        assert act.live == 5 * (8 + 16) * F32
        del y                                   # graph dropped without backward: released too
        assert act.live == 0


def test_gradients_unchanged_by_measuring():
    cfg = GPTConfig(n_layers=2)
    idx, targets = synthetic_task(cfg, batch_size=4, steps=1)[0]
    plain, measured = gpt(cfg, seed=1), gpt(cfg, seed=1)
    lm_loss(plain(idx), targets).backward()
    with SavedActivations() as act:
        lm_loss(measured(idx), targets).backward()
    assert act.live == 0 and act.peak > 0
    for p, q in zip(plain.parameters(), measured.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_gpt_activations_grow_linearly_with_batch():
    cfg = GPTConfig(n_layers=2)
    peaks = []
    for b in (2, 4):
        idx, targets = synthetic_task(cfg, batch_size=b, steps=1)[0]
        model = gpt(cfg)
        with SavedActivations() as act:
            lm_loss(model(idx), targets).backward()
        peaks.append(act.peak)
    # everything saved is per example except the (T, T) causal masks and the position ids
    assert 1.9 < peaks[1] / peaks[0] <= 2.0


def test_model_memory_sgd_momentum_and_adam_match_hand_counts():
    model = mlp((8, 16, 4), seed=0)
    n = 8 * 16 + 16 + 16 * 4 + 4                                 # 212 parameters in 4 tensors
    assert model_memory(model) == {"parameters": n * F32, "gradients": 0, "optimizer": 0}
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))

    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.functional.cross_entropy(model(x), y).backward()
    sgd.step()
    assert model_memory(model, sgd) == {"parameters": n * F32, "gradients": n * F32, "optimizer": n * F32}

    model = mlp((8, 16, 4), seed=0)
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    assert model_memory(model, adam)["optimizer"] == 0           # state is created lazily, at the first step
    nn.functional.cross_entropy(model(x), y).backward()
    adam.step()
    # exp_avg and exp_avg_sq (2 x n floats) and a float32 scalar `step` per parameter tensor
    assert model_memory(model, adam) == {"parameters": n * F32, "gradients": n * F32,
                                         "optimizer": 2 * n * F32 + 4 * F32}
    model.zero_grad(set_to_none=True)
    assert model_memory(model, adam)["gradients"] == 0


def test_cuda_peak_bytes_is_none_on_cpu():
    assert cuda_peak_bytes("cpu") is None
    if not torch.cuda.is_available():
        assert cuda_peak_bytes() is None


def test_plot_memory_stacks_parts_per_rank():
    per_rank = [{"parameters": 2**20, "gradients": 2**20, "activations": 3 * 2**20},
                {"parameters": 2**20, "optimizer": 2**21, "extra": 2**19}]
    ax = plot_memory(per_rank, title="t")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        ["parameters", "gradients", "optimizer", "activations", "extra"]
    heights = [sum(p.get_height() for p in c) for c in ax.containers]
    assert heights == pytest.approx([2.0, 1.0, 2.0, 3.0, 0.5])    # MB per part, summed over ranks
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]
    plt.close("all")
    with pytest.raises(ValueError, match="unit='TB'"):
        plot_memory(per_rank, unit="TB")
    with pytest.raises(ValueError, match="1 labels for 2 bars"):
        plot_memory(per_rank, labels=["a"])


def test_received_activation_counts_parameters_do_not():
    # a stage's input arrives as a leaf that requires grad (we need dL/dx): an activation
    model, x = linear_stack(), torch.randn(5, 8, requires_grad=True)
    with SavedActivations() as act:
        y = model(x)                            # now Linear also saves its weight: not counted
    assert act.live == 5 * (8 + 16 + 32) * F32
    y.sum().backward()
    assert act.live == 0 and x.grad is not None


def test_ignore_and_reentering_once_per_step():
    w = torch.randn(8, 3, requires_grad=True)   # a weight kept as a plain tensor, not an nn.Parameter
    act = SavedActivations(ignore=[w])
    for _ in range(3):
        x = torch.randn(5, 8, requires_grad=True)
        with act:
            y = (x @ w).tanh()                  # saves x (and w: ignored) and tanh's output
        assert act.live == (5 * 8 + 5 * 3) * F32
        y.sum().backward()
        assert act.live == 0
    assert act.peak == (5 * 8 + 5 * 3) * F32
    with SavedActivations() as counted:
        z = (torch.randn(5, 8, requires_grad=True) @ w).sum()
        assert counted.live == (5 * 8 + 8 * 3) * F32     # without ignore, w is just another saved leaf
    del z
    assert counted.live == 0
