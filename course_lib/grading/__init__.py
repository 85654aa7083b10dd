"""The course's tooling, not its lessons: authoring exercise sets, grading them in a sandbox.

- ``authoring``: writes ``exercises/`` from ``solutions/`` and executes notebooks;
- ``grade``: scores submissions (``python -m course_lib.grade``);
- ``sandbox``, ``worker``, ``wire``: the sandbox a submission runs in, the process
  inside it, and the plain data that crosses between them;
- ``nbval_record``: a pytest plugin that records each notebook cell's outcome.

A learner never needs to open this package.
"""
