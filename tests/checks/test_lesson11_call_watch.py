"""calls_of, which lesson 11's graders use to see a learner's function call the library's answer:
it sees the function under any name, only inside its block, and leaves a profiler it finds."""
import sys

from course_lib.checks.engine.call_watch import calls_of
from course_lib.topics import memory
from course_lib.topics.memory import fitting_recipes as renamed


def test_calls_of_sees_the_function_under_any_name_and_only_in_its_block():
    with calls_of(memory.fitting_recipes, memory.estimate_memory) as called:
        renamed(10**9, 80 * 2**30, 8, recipes=memory.RECIPES[:2])
    assert called.count("fitting_recipes") == 1 and called.count("estimate_memory") == 2
    memory.fitting_recipes(10**9, 80 * 2**30, 8)
    assert called.count("fitting_recipes") == 1
    with calls_of(memory.fitting_recipes) as called:
        memory.estimate_memory(10**9)
    assert called == []


def test_calls_of_keeps_the_profiler_it_finds():
    seen = []

    def profiler(frame, event, arg):
        seen.append(event)

    sys.setprofile(profiler)
    try:
        with calls_of(memory.fitting_recipes):
            memory.estimate_memory(10**9)
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert "call" in seen
