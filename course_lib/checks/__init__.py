"""The graders behind every exercise's check cell: an engine, and a module or package per lesson.

    engine/        what every lesson shares (verdicts, running code on ranks, oracles, measures);
                   it imports no lesson
    lessonNN.py    lesson NN's graders, where one file holds them
    lessonNN/      lesson NN's graders (in __init__.py) and the helpers only that lesson uses

A notebook's check cell imports ``check_*`` from ``course_lib.checks.lessonNN``. A lesson imports
the engine and the layers below checks/, never another lesson (tests/test_layout.py).

Conventions for lesson authors (tests/checks/test_checks.py enforces them):

- A grader is a function named ``check_<exercise>`` decorated with ``@grader("<exercise title>")``.
  Its body only asserts, through ``expect_equal`` / ``expect_close`` / ``expect`` (each raises
  ``GradingError``); it prints nothing and returns nothing. On success the decorator prints the
  one fixed line ``✓ <exercise title>: passed``; a stub's ``NotImplementedError`` becomes a
  ``GradingError`` that tells the learner to fill in the exercise.
- A failure is a verdict: what, expected, got, and a hint that points at the mistake the answer
  shows (which rank, which step, which value), never at the code of the fix. In a notebook it shows
  as the verdict alone, no grader frame (``GradingError._render_traceback_``); ``details`` carries
  what the learner needs below it, e.g. a rank's own traceback (``ranks.run_on_ranks`` fills it).
- Nothing else may reach a check cell's output: a grader that launches ranks passes
  ``output="none"``, and build-lessons refuses a check cell that stored any other line.
- A grader checks what the exercise's text asks, by behaviour, never by how it was spelled: any
  integer type where it asks for a whole number, any API that does the job (bytes are counted
  below the Python API), placement on a mix of devices, two steps where state can leak, a crash
  at every step of a save, the printed value where it asks to print. Where the text is ambiguous,
  sharpen the text, not the grader's tolerance.
- The answers that test a grader are not shipped here: tests/checks/answers/lessonNN.py holds, per
  grader, at least three plausible wrong answers (each must be rejected with a verdict) and at
  least two correct answers written differently from the solution (each must pass).
- The check cell under the exercise is exactly::

      # NBVAL_CHECK_OUTPUT
      check_average_gradients(average_gradients)
"""
