"""``python -m course_lib.authoring``: write exercises/ from solutions/ (code in course_lib/grading/)."""
import sys

from .grading.authoring import main

if __name__ == "__main__":
    sys.exit(main())
