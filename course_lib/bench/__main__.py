"""``python -m course_lib.bench``: the shape buckets (``cli.py``)."""
import sys

from .cli import main

sys.exit(main())
