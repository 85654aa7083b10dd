"""The attention impls, by name.

Each impl is a module with ``attention_forward(q, k, v, opts, mask)`` taking
validated dense inputs (see ``course_lib.api``) and returning ``(out, lse)``,
and optionally ``available() -> bool``.  Modules are imported on first use so
that a missing optional dependency only disables its own impl.
"""
import importlib

IMPLS = {
    "reference": "course_lib.reference",
    "naive": "course_lib.kernels.naive",
    "flash_numpy": "course_lib.kernels.flash_numpy",
    "flash_numba_cpu": "course_lib.kernels.flash_numba_cpu",
    "flash_numba_cuda": "course_lib.kernels.flash_numba_cuda",
}

# Impls that compute attention for the learner; exercises may not call them.
COURSE_KERNELS = tuple(IMPLS)


def load(name):
    """The module of impl ``name``, or None when it is not usable here."""
    try:
        module = importlib.import_module(IMPLS[name])
    except ImportError:
        return None
    available = getattr(module, "available", None)
    return module if available is None or available() else None
