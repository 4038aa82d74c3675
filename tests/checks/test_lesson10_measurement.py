"""Lesson 10's measurement is judged against a real record: made-up figures, wrong units and records
of another loader are rejected; the share and the workers are judged against the record itself.

WRONG_ANSWERS in tests/checks/answers/lesson10.py holds the mistakes that need no measurement of
the lesson's loader; the ones here need a real record of it, made once.
"""
import math
import warnings

import pytest
from torch.utils.data import DataLoader

from answers.lesson10 import features_file
from course_lib.checks import lesson10
from course_lib.checks.engine import GradingError
from course_lib.topics.input_pipeline import DataWait, SlowDataset, device_step, measure_data_wait

pytestmark = pytest.mark.timeout(300)


def measure(**loader_options):
    dataset = SlowDataset(features_path=features_file("right"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DataLoader(dataset, batch_size=loader_options.pop("batch_size", 32), shuffle=True,
                            **loader_options)
        return measure_data_wait(loader, device_step(0.020), steps=6, warmup=2)


@pytest.fixture(scope="module")
def record():
    return measure()


def right_answer(record):
    data, compute = record["data"], record["compute"]
    return data / (data + compute), math.ceil(1.5 * data / compute)


def test_a_real_measurement_passes(record, capsys):
    lesson10.check_loader_measurement(record, *right_answer(record))
    assert "passed" in capsys.readouterr().out


def copy_of(record):
    """The record as a plain dict with the same numbers: what a learner who retypes it passes."""
    return dict(record)


def scaled_in_place(record, factor):
    changed = DataWait(record)
    changed.__dict__.update(record.__dict__)
    changed["data"], changed["compute"] = record["data"] * factor, record["compute"] * factor
    return changed


def with_forged_step(record):
    forged = DataWait(record)
    forged.__dict__.update(record.__dict__)
    started, loaded, finished = forged.steps[0]
    forged.steps = [(started, loaded + 0.01, finished + 0.01)] + forged.steps[1:]
    forged["data"] += 0.01
    return forged


MISTAKES = {
    "the record copied into a plain dict": lambda r: (copy_of(r), *right_answer(r)),
    "the record in milliseconds, in place": lambda r: (scaled_in_place(r, 1000),
                                                       *right_answer(r)),
    "the record in microseconds, in place": lambda r: (scaled_in_place(r, 1e6), *right_answer(r)),
    "a step's timings changed after measuring": lambda r: (with_forged_step(r),
                                                           *right_answer(r)),
    "share = data / compute": lambda r: (r, r["data"] / r["compute"], right_answer(r)[1]),
    "share as a percentage": lambda r: (r, 100 * right_answer(r)[0], right_answer(r)[1]),
    "the compute share": lambda r: (r, 1 - right_answer(r)[0], right_answer(r)[1]),
    "workers rounded down": lambda r: (r, right_answer(r)[0],
                                       int(1.5 * r["data"] / r["compute"])),
    "workers without headroom": lambda r: (r, right_answer(r)[0],
                                           math.ceil(r["data"] / r["compute"])),
    "workers as a float": lambda r: (r, right_answer(r)[0], 1.5 * r["data"] / r["compute"]),
    "workers from the nominal 1 ms reads": lambda r: (r, right_answer(r)[0],
                                                      math.ceil(1.5 * 32 * 0.001 / 0.020)),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_mistake_on_a_real_record_is_rejected(record, mistake):
    measurement, share, num_workers = MISTAKES[mistake](record)
    if mistake == "workers from the nominal 1 ms reads" and num_workers == right_answer(record)[1]:
        pytest.skip("this machine reads as fast as the nominal 1 ms: the two agree")
    with pytest.raises(GradingError):
        lesson10.check_loader_measurement.__wrapped__(measurement, share, num_workers)


def test_a_record_of_the_loader_with_workers_is_rejected():
    with_workers = measure(num_workers=2)
    with pytest.raises(GradingError, match="num_workers"):
        lesson10.check_loader_measurement.__wrapped__(with_workers, *right_answer(with_workers))


def test_a_record_of_smaller_batches_is_rejected():
    small = measure(batch_size=8)
    with pytest.raises(GradingError, match="batches' sizes"):
        lesson10.check_loader_measurement.__wrapped__(small, *right_answer(small))


def test_a_record_typed_in_with_its_records_copied_is_rejected(record):
    typed = DataWait(record)
    typed.__dict__.update(record.__dict__)
    typed.seal = "0" * 64
    with pytest.raises(GradingError, match="this session"):
        lesson10.check_loader_measurement.__wrapped__(typed, *right_answer(record))


def test_the_milliseconds_verdict_names_the_unit(record):
    with pytest.raises(GradingError, match="milliseconds"):
        lesson10.check_loader_measurement.__wrapped__(scaled_in_place(record, 1000),
                                                      *right_answer(record))
