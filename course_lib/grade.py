"""``python -m course_lib.grade SUBMISSION.ipynb...``: score submissions (code in course_lib/grading/)."""
import sys

from .grading.cli import main

if __name__ == "__main__":
    sys.exit(main())
