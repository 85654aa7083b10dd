"""The attention impls, by name.

Each impl is a module with ``attention_forward(q, k, v, opts, mask)`` taking
validated dense inputs (see ``core.options``) and returning ``(out, lse)``,
and optionally ``available() -> bool``.  Modules are imported on first use so
that a missing optional package only disables its own impl; any other failure
to import (a bug, a syntax error, a course module that is missing) is raised,
with the impl's name, so that an impl never silently drops out of
``available_impls()`` and out of every test that loops over it.
"""
import importlib

IMPLS = {
    "reference": "course_lib.core.reference",
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
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] == "course_lib":
            raise ImportError(f"impl {name!r} failed to import: {error}") from error
        return None  # an optional package this impl needs is not installed
    except Exception as error:
        raise ImportError(f"impl {name!r} failed to import: {type(error).__name__}: {error}") from error
    available = getattr(module, "available", None)
    return module if available is None or available() else None
