"""The course's tooling, not its lessons: authoring exercise sets, grading them in a sandbox.

- ``authoring``: writes ``exercises/`` from ``solutions/`` and executes notebooks;
- ``cli``: the grader's command line and reports (``python -m course_lib.grade``);
- ``pipeline``: grades a submission, exercise by exercise (what it does, and why, is there);
- ``submission``: reads a submission, matches its cells to the course's, finds edited checks;
- ``names``: what the course's cells bind and read, so which of them run and where;
- ``session``: one submission's sandboxes, and what stands for the answers in a check;
- ``kernels``: a learner's CUDA kernels, taken from the answer's text and checked apart;
- ``sandbox``, ``worker``, ``wire``: the sandbox a submission runs in, the process
  inside it, and the plain data that crosses between them;
- ``seccomp``: the system calls a sandbox may not make (memory outside its processes,
  new sessions, kernel keys, namespaces), as the filter bubblewrap loads;
- ``nbval_record``: a pytest plugin that records each notebook cell's outcome.

A learner never needs to open this package.
"""
