"""course_lib: the library behind "FlashAttention from the ground up".

    from course_lib import attention, attention_varlen, available_impls
"""
__version__ = "0.1.0"

from .api import (
    attention,
    attention_backward,
    attention_backward_varlen,
    attention_varlen,
    available_backward_impls,
    available_impls,
)

__all__ = ["attention", "attention_varlen", "available_impls", "attention_backward",
           "attention_backward_varlen", "available_backward_impls", "__version__"]
