"""views.text: printed lines wrapped to a notebook's width at spaces, nothing else changed."""
import pytest

from course_lib.views.text import WIDTH, fitted, say, wrapped

VERDICT = ("PASS attention (float32, q 1x4x21x16, k/v 1x2x27x16/1x2x27x16, causal): out and lse within "
           "atol 1e-05, rtol 0.0001 or 2 x naive float32 error + rounding")


def test_a_long_line_is_wrapped_at_spaces_onto_indented_lines_that_fit():
    lines = wrapped(VERDICT).split("\n")
    assert len(lines) == 2 and all(len(line) <= WIDTH for line in lines)
    assert lines[1].startswith("    ") and not lines[1].startswith("     ")
    assert " ".join(wrapped(VERDICT).split()) == VERDICT


def test_an_indented_line_continues_under_its_own_indent():
    lines = wrapped("  " + VERDICT).split("\n")
    assert lines[1].startswith("      ") and not lines[1].startswith("       ")


def test_lines_that_fit_are_left_as_they_are():
    aligned = "   64  64     128  8 True       0     30.64   254       0"
    assert wrapped(f"{aligned}\n{aligned}") == f"{aligned}\n{aligned}"


def test_say_prints_wrapped(capsys):
    say("row", VERDICT)
    assert capsys.readouterr().out == wrapped("row " + VERDICT) + "\n"


def test_fitted_prints_the_blocks_lines_wrapped_and_keeps_them_when_it_raises(capsys):
    with fitted():
        print("row", end=" ")
        print(VERDICT)
    assert capsys.readouterr().out == wrapped("row " + VERDICT) + "\n"
    with pytest.raises(AssertionError), fitted():
        print("FAIL the report a learner must see")
        raise AssertionError
    assert capsys.readouterr().out == "FAIL the report a learner must see\n"
