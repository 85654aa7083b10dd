"""Chapter 02's GPU figures are the ones benchmarks/gpu_peaks.py recorded, in the library and in the prose.

The H200's measured copy bandwidth and fp32 ceiling (``core.hardware``), the peers' speeds at the
plotted shape (``models.roofline.ATTENTION_SPEEDS``) and the ncu byte counts of FlashAttention-2
(``models.iomodel.MEASURED_NCU``) are constants a lecture prints; each must equal its record, and
the numbers chapter 02's text quotes must equal those.
"""
import re

import pytest

from course_lib.core import hardware
from course_lib.models import iomodel, roofline

from lectures import markdown, records

RUN = "20261207T183811+0000"


def recorded(**match):
    found = records("gpu_peaks", run=RUN, **match)
    assert len(found) == 1, match
    return found[0]


def chapter_02_text():
    return markdown("02")


def test_the_h200_ceilings_are_the_recorded_ones():
    h200 = hardware.HARDWARE["h200"]
    copy, sgemm = recorded(measure="copy_bandwidth"), recorded(measure="sgemm_fp32")
    assert copy["device"] == sgemm["device"] == "NVIDIA H200"
    assert h200.measured["bandwidth"].value == pytest.approx(copy["value"], rel=5e-3)
    assert h200.measured["flops:float32"].value == pytest.approx(sgemm["value"], rel=5e-3)
    assert h200.measured["bandwidth"].date == copy["environment"]["date"][:10]


@pytest.mark.parametrize("impl, label", [("torch_sdpa_cudnn", "PyTorch SDPA cuDNN"),
                                         ("torch_sdpa_flash", "PyTorch SDPA flash (FA2)")])
def test_the_peers_speeds_are_the_recorded_ones(impl, label):
    rec = recorded(impl=impl, dtype="float16", Nq=8192)
    point = next(p for p in roofline.ATTENTION_SPEEDS if p["label"].startswith(label))
    assert (rec["B"], rec["H"], rec["Nq"], rec["D"], rec["causal"]) == (point["batch"], point["heads"],
                                                                        point["seqlen"], point["head_dim"], False)
    assert point["tflops"] == pytest.approx(rec["tflops"], rel=5e-3)
    assert point["date"] == rec["environment"]["date"][:10] and point["kind"] == "measured"


def test_the_ncu_counts_are_the_recorded_ones():
    for point in iomodel.MEASURED_NCU:
        rec = recorded(kind="ncu", Nq=point["seqlen"])
        assert (rec["B"], rec["H"], rec["D"], rec["dtype"]) == (point["batch"], point["heads"], point["head_dim"],
                                                                "float16")
        assert point["dram_bytes"] == pytest.approx(rec["dram_bytes"], rel=5e-3)
        assert point["l2_bytes"] == pytest.approx(rec["l2_bytes"], rel=5e-3)
        assert point["date"] == rec["environment"]["date"][:10]


def test_chapter_02_quotes_the_recorded_speeds_and_fa3s_figure_at_the_plotted_shape():
    text = chapter_02_text()
    cudnn = {round(float(x)) for x in re.findall(r"cuDNN\s+(?:kernel\s+)?(?:ran at |reaches it \()(\d+) TFLOP/s", text)}
    assert len(re.findall(r"cuDNN\s+(?:kernel\s+)?(?:ran at |reaches it \()(\d+) TFLOP/s", text)) == 2
    assert cudnn == {round(recorded(impl="torch_sdpa_cudnn", Nq=8192)["tflops"])}
    fa2 = {round(float(x)) for x in re.findall(r"FlashAttention-2 (?:at |stays below it \()(\d+) TFLOP/s", text)}
    assert fa2 == {round(recorded(impl="torch_sdpa_flash", Nq=8192)["tflops"])}
    fa3 = re.findall(r"FlashAttention-3's paper reports about\s+(\d+) TFLOP/s", text) + re.findall(
        r"FA3 beats it by half\s+\(about (\d+)", text)
    fa3_point = next(p for p in roofline.ATTENTION_SPEEDS if p["label"].startswith("FlashAttention-3"))
    assert fa3 and {float(x) for x in fa3} == {fa3_point["tflops"]}  # 646 at D = 128, N = 8K (740 is D = 256's)


def test_chapter_02_quotes_the_recorded_share_of_the_datasheet_bandwidth():
    h200 = hardware.HARDWARE["h200"]
    share = re.search(r"measured copy bandwidth is about (\d+)% of the datasheet", chapter_02_text())
    assert share and int(share.group(1)) == round(100 * h200.measured["bandwidth"].value / h200.bandwidth.value)
