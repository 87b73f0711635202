"""A user's test file for test-triage's tests: passing tests around one that kills its process and one that
hangs, and a test whose own code is wrong."""
import os
import signal
import time


def test_before():
    assert sum([1, 2]) == 3


def test_kills_its_process():
    os.kill(os.getpid(), signal.SIGSEGV)


def test_between():
    assert "ab".upper() == "AB"


def test_hangs():
    time.sleep(600)


def test_own_code_is_wrong():
    assert undefined_name  # noqa: F821


def test_after():
    assert [3, 1, 2].index(2) == 2
