"""What a failing check tells a learner: it fits the output it checks.

A failure names a query tile only for attention outputs, never prints a
relative error beside an infinite absolute one, keeps the head axis in the
heat map of an attention output (a GQA head-mapping mistake is one bad head),
and shows IPython a two-line summary instead of a traceback into checks.py.
"""
import numpy as np
import pytest

import course_lib
from course_lib import checks

from conftest import make_qkv


def report(call):
    with pytest.raises(checks.CheckFailed) as failed:
        call()
    return failed.value


def test_a_plain_array_failure_says_nothing_of_tiles(capsys):
    wrong = np.ones((40, 50))
    wrong[37, 3] = 2
    report(lambda: checks.check_close("scores", wrong, np.ones((40, 50))))
    out = capsys.readouterr().out
    assert "worst element (37, 3)" in out and "tile" not in out


def test_an_attention_failure_names_the_query_row_and_tile(capsys):
    q, k, v = make_qkv(1, 1, 2, 2, 70, 70, 8)
    out = course_lib.attention(q, k, v)
    out[0, 1, 66] += 1  # one row of the second query tile of 64
    report(lambda: checks.check_attention(out, q, k, v, name="att", block_q=64))
    text = capsys.readouterr().out
    assert "query row 66, in query tile 1 of 64 rows" in text
    assert "errors in 1 of 2 heads (1)" in text


def test_an_answer_without_tiles_is_told_its_row_and_no_tile(capsys):
    q, k, v = make_qkv(1, 1, 2, 2, 70, 70, 8)
    out = course_lib.attention(q, k, v)
    out[0, 1, 66] += 1
    report(lambda: checks.check_attention(out, q, k, v, name="att"))
    text = capsys.readouterr().out
    assert "that is query row 66\n" in text and "tile" not in text
    assert "errors in 1 of 2 heads (1)" in text


def test_the_lse_tile_is_read_from_its_last_axis(capsys):
    q, k, v = make_qkv(2, 1, 3, 3, 40, 40, 8)
    out, lse = course_lib.attention(q, k, v, return_lse=True)
    lse[0, 2, 33] += 1
    report(lambda: checks.check_attention(out, q, k, v, name="att", lse=lse, block_q=16))
    text = capsys.readouterr().out
    assert "query row 33, in query tile 2 of 16 rows" in text and "errors in 1 of 3 heads (2)" in text


def test_nan_or_inf_errors_give_no_relative_error(capsys):
    wrong = np.full((4, 5), 1e-16)
    wrong[1, 2] = np.inf
    report(lambda: checks.check_close("softmax", wrong, np.full((4, 5), 1e-16 + 1e-22)))
    text = capsys.readouterr().out
    assert "1 element(s) NaN or inf" in text and "max abs error inf" in text
    assert "max rel error" not in text


def test_the_relative_error_is_that_of_the_elements_off(capsys):
    expected = np.array([1.0, 2.0, 4.0])
    report(lambda: checks.check_close("x", expected * [1, 1, 1.5], expected))
    assert "max abs error 2, max rel error 0.5" in capsys.readouterr().out


def test_a_gqa_head_mapping_mistake_shows_as_the_wrong_heads(capsys):
    H, Hk = 6, 2
    q, k, v = make_qkv(3, 2, H, Hk, 37, 45, 16, 8)
    interleaved = [h % Hk for h in range(H)]  # the mistake: h % Hk instead of h // (H // Hk)
    wrong = course_lib.attention(q, k[:, interleaved], v[:, interleaved])
    report(lambda: checks.check_attention(wrong, q, k, v, name="gqa"))
    text = capsys.readouterr().out
    assert "errors in 2 of 6 heads (1, 4)" in text
    rows = [line for line in text.splitlines() if line.startswith("  rows")]
    assert rows and all(line.endswith("| #  # |") for line in rows)  # heads 1 and 4 off on every row


def test_ipython_shows_the_verdict_not_a_traceback():
    failed = report(lambda: checks.check_value("bytes", 3, 4))
    lines = failed._render_traceback_()
    assert lines[0] == "CheckFailed: FAIL bytes: value is off"
    assert len(lines) == 2 and not any("checks.py" in line for line in lines)


def test_quietly_returns_the_word_and_the_rule_and_still_fails_loudly(capsys):
    q, k, v = make_qkv(3, 1, 2, 2, 9, 11, 8, 8)
    right = course_lib.attention(q, k, v, impl="reference")
    assert checks.quietly(checks.check_attention, right, q, k, v) == ("PASS", "atol 1e-10, rtol 1e-09")  # float64
    assert capsys.readouterr().out == ""
    with pytest.raises(checks.CheckFailed):
        checks.quietly(checks.check_attention, right + 1, q, k, v)
    said = capsys.readouterr().out
    assert said.startswith("FAIL attention") and "worst element" in said
