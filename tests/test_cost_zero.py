"""ddnb.cost.zero: the ZeRO paper's Figure 1 numbers (Ψ = 7.5 B, N = 64, K = 12:
120 GB, 31.4 GB, 16.6 GB, 1.9 GB), the parts of each stage, the fp32 form that
ddnb.sharding runs, the bytes sent per step (stages 0, 1, 2 alike, stage 3 1.5x: Sec. 7.2),
and bad input refused with every value named."""
import pytest

from ddnb.cost import zero_comm_bytes, zero_memory, zero_memory_parts
from ddnb.sharding import expected_state_bytes

PSI, N = 7.5e9, 64


@pytest.mark.parametrize("stage, gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_paper_figure_1(stage, gb):
    assert round(zero_memory(PSI, N, stage) / 1e9, 1) == gb


def test_exact_formulas():
    assert zero_memory(PSI, N, 0) == 16 * PSI
    assert zero_memory(PSI, N, 1) == 4 * PSI + 12 * PSI / N
    assert zero_memory(PSI, N, 2) == 2 * PSI + 14 * PSI / N
    assert zero_memory(PSI, N, 3) == 16 * PSI / N
    assert zero_memory_parts(PSI, N, 2) == {"parameters": 2 * PSI, "gradients": 2 * PSI / N,
                                            "optimizer": 12 * PSI / N}


def test_bytes_sent_stages_1_and_2_as_plain_data_parallel_stage_3_half_more():
    all_reduce = 2 * 63 / 64 * 2 * PSI                             # fp16 gradients, ring, N = 64
    assert [zero_comm_bytes(PSI, N, s) for s in range(4)] == [all_reduce] * 3 + [1.5 * all_reduce]
    assert round(all_reduce / 1e9, 2) == 29.53
    # fp32 (ddnb.sharding): f·4Ψ per reduce-scatter or all-gather
    assert zero_comm_bytes(1000, 4, 1, param_bytes=4, grad_bytes=4) == 0.75 * 4000 * 2
    assert zero_comm_bytes(1000, 4, 0, param_bytes=8, grad_bytes=4) == 0.75 * 4000 * 2   # stage 0 sends no params
    assert zero_comm_bytes(PSI, 1, 3) == 0.0                        # one device sends nothing
    with pytest.raises(ValueError, match=r"num_params=0.*stage=4"):
        zero_comm_bytes(0, 8, 4)


def test_stages_only_shrink_and_one_device_is_stage_0():
    for n in (1, 2, 8, 1024):
        totals = [zero_memory(1e9, n, s) for s in range(4)]
        assert totals == sorted(totals, reverse=True)
    assert {zero_memory(1e9, 1, s) for s in range(4)} == {16e9}
    assert zero_memory(1e9, 8, 0) == zero_memory(1e9, 4096, 0)      # plain DP: N does not help


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_fp32_form_equals_the_implementations_formula_without_padding(stage, n):
    units = [1024, 12704, 12704, 576]                              # GPTConfig(n_layers=2): no padding for n | 8
    exact = expected_state_bytes(units, n, stage)
    assert zero_memory_parts(sum(units), n, stage, k=8, param_bytes=4, grad_bytes=4) == exact


def test_padding_costs_at_most_one_element_per_unit_and_rank():
    units = [930, 11190, 11190, 510]                               # none divisible by 4
    for stage in (1, 2, 3):
        exact = expected_state_bytes(units, 4, stage)
        paper = zero_memory_parts(sum(units), 4, stage, k=8, param_bytes=4, grad_bytes=4)
        for part in exact:
            assert paper[part] <= exact[part] <= paper[part] + 4 * 8 * len(units) * 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_params=1e9, world_size=8, stage=4), r"stage=4: need one of \[0, 1, 2, 3\]"),
    (dict(num_params=1e9, world_size=0, stage=1), r"world_size=0: need an integer >= 1"),
    (dict(num_params=0, world_size=8, stage=1), r"num_params=0: need a number > 0"),
    (dict(num_params=-5, world_size=8, stage=1), r"num_params=-5: need a number > 0"),
    (dict(num_params=1e9, world_size=2.5, stage=1), r"world_size=2.5: need an integer >= 1"),
    (dict(num_params=1e9, world_size=8, stage=True), r"stage=True: need one of"),
    (dict(num_params=1e9, world_size=8, stage=1, k=-1), r"k=-1: need a number >= 0 \(bytes per parameter\)"),
    (dict(num_params="7B", world_size=8, stage=1), r"num_params='7B': need a number > 0"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zero_memory(**kwargs)


def test_every_bad_value_is_named_at_once():
    with pytest.raises(ValueError) as e:
        zero_memory(0, 0, 7)
    assert "num_params=0" in str(e.value) and "world_size=0" in str(e.value) and "stage=7" in str(e.value)


def test_expected_state_bytes_rejects_bad_input():
    with pytest.raises(ValueError, match=r"stage=5"):
        expected_state_bytes([10], 2, 5)
    with pytest.raises(ValueError, match=r"world_size=0"):
        expected_state_bytes([10], 0, 1)


def test_plot_and_calculator_widget():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddnb.viz import ZeroMemoryExplorer, plot_zero_stages

    ax = plot_zero_stages(7.5e9, 64, stage=2)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["stage 0", "stage 1", "stage 2", "stage 3"]
    assert len(ax.patches) == 3 * 4                                # 3 parts x 4 stages
    heights = [sum(p.get_height() for p in ax.patches[s::4]) for s in range(4)]
    assert [round(h, 1) for h in heights] == [120.0, 31.4, 16.6, 1.9]   # decimal GB, as the paper
    plt.close("all")
    e = ZeroMemoryExplorer(billions=7.5, world_size=64, stage=1)
    assert e.status.value.startswith("stage 1: 31.4 GB") and e.image.value
    image = e.image.value
    e.world_size.value = 0                                         # shown, not raised
    assert "world_size=0: need an integer >= 1" in e.status.value
    assert e.image.value == image
    e.world_size.value = 64
    e.billions.value = -1
    assert "num_params=-1000000000.0: need a number > 0" in e.status.value
