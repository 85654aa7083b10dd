"""benchmarks/gpu_counters.py's arithmetic on ncu's counters, which runs without a GPU."""
import importlib.util
import math
from pathlib import Path

_spec = importlib.util.spec_from_file_location("gpu_counters", Path(__file__).parent.parent / "benchmarks" / "gpu_counters.py")
gc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc)

LD, ST = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"


def test_ldmatrix_conflicts_are_the_shared_total_less_plain_loads_and_stores_where_ncu_has_no_ldsm_count():
    counters = {gc.SHARED_CONFLICTS: 1000.0, LD: 300.0, ST: 200.0}
    assert gc.ldsm_conflicts(counters) == 500.0                # not 700 (stores kept) nor 1000 (the total)
    assert gc.ldsm_conflicts({**counters, gc.LDSM_CONFLICTS: 42.0}) == 42.0     # ncu's own count first
    assert math.isnan(gc.ldsm_conflicts({LD: 300.0, ST: 200.0}))               # not measured is not zero
    assert gc.SHARED_CONFLICTS in gc.MMA_METRICS and gc.LDSM_CONFLICTS in gc.MMA_METRICS
