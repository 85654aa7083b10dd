"""Chapter 11's account of reaching Hopper's instructions from Numba is what benchmarks/hopper_reach.py recorded."""
import re

from lectures import markdown, records

RUN = "20261207T193230+0000"


def check(name):
    found = records("hopper_reach", run=RUN, check=name)
    assert len(found) == 1, name
    return found[0]


def test_a_plain_jit_kernel_is_built_for_sm_90a_though_inspect_asm_shows_sm_90():
    rec = check("fence_jit")
    assert rec["pass"] and rec["ptx_target_default"] == "sm_90a" and rec["ptx_target_inspect_asm"] == "sm_90"
    assert rec["cubin_cc_keys"] == [[9, 0, "a"]]


def test_wgmma_on_one_warp_is_the_illegal_instruction_not_the_target():
    rec = check("fence_jit_warp")
    assert not rec["pass"] and "ILLEGAL_INSTRUCTION" in rec["error"] and "[1, 32]" in rec["tried"]


def test_chapter_11_quotes_the_probes_as_recorded():
    text = markdown("11")
    assert f"run {RUN}" in text
    for name in ("fence_jit", "wgmma", "setmaxnreg", "tma"):
        assert check(name)["pass"], name
    quoted = re.search(r"matched float64 numpy to ([\d.e-]+)", text).group(1)
    assert float(quoted) == float(f"{check('wgmma')['variants']['leading=K,stride=MN']['rel_err']:.1e}")
    assert "built for `sm_90a`" in text and "all four warps of a warpgroup" in text
