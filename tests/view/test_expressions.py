"""Filter expressions over world variables: what they select, and what they refuse."""

from __future__ import annotations

import numpy as np
import pytest

from flyarchive.errors import SelectionError
from flyarchive.view.expressions import evaluate

COLUMNS = {"world": np.arange(4), "success": np.array([1, 0, 1, 0]),
           "distance": np.array([6.0, 2.0, 7.5, np.nan]),
           "ok": np.array([True, False, False, True]), "genotype": np.array(["wt", "x", "wt", "x"])}


@pytest.mark.parametrize("text, expected", [
    ("success == 1 and distance > 5", [True, False, True, False]),
    ("distance > 7 or world == 1", [False, True, True, False]),
    ("not ok", [False, True, True, False]),
    ("success and not ok", [False, False, True, False]),
    ("0 < distance < 7", [True, True, False, False]),
    ("distance / 2 >= 3", [True, False, True, False]),
    ("genotype == 'wt'", [True, False, True, False]),
    ('genotype != "wt" and ok == true', [False, False, False, True]),
    ("distance != distance", [False, False, False, True]),  # NaN
    ("-distance < -6.5", [False, False, True, False]),
    ("distance > -inf", [True, True, True, False]),  # inf as nan is: a constant
])
def test_an_expression_selects_the_rows_where_it_holds(text, expected):
    actual = evaluate(text, COLUMNS)

    assert actual.tolist() == expected


def test_names_in_backticks_are_any_world_variable_s_names():
    """A variable named class (a brushed scatter wrote class >= ...) could not be filtered."""
    columns = {**COLUMNS, "class": np.array([0.0, 1.0, 2.0, 3.0]),
               "wing span": np.array([5.0, 6.0, 7.0, 8.0]), "über": np.array([1, 1, 0, 0])}

    actual = evaluate("`class` >= 1 and `wing span` < 8 and über == 1 and genotype != 'a`b'",
                      columns)

    assert actual.tolist() == [False, True, False, False]


def test_a_constant_expression_applies_to_every_row():
    assert evaluate("1 == 1", COLUMNS).tolist() == [True] * 4


@pytest.mark.parametrize("text, fragment", [
    ("success = 1", "Use == to compare: success == 1"),
    ("distance >", "Cannot read the filter 'distance >'"),
    ("succes == 1", "Did you mean 'success'?"),
    ("Distance > 1", "Did you mean 'distance'?"),
    ("zzz > 1", "which is no world variable. Variables: 'world', 'success'"),
    ("__import__('os').system('true')", "which a filter cannot contain"),
    ("distance.real > 1", "'distance.real', which a filter cannot contain"),
    ("[x for x in world]", "which a filter cannot contain"),
    ("distance ** 2 > 1", "'distance ** 2', which a filter cannot contain"),
    ("lambda: 1", "which a filter cannot contain"),
    ("success == 1; import os", "Cannot read the filter"),
    ("genotype > 1", "compares text with a number"),
    ("genotype", "uses text as true/false"),
    ("genotype + 1 > 2", "arithmetic on text"),
    ("", "is empty"),
    ("x" * 3000, "at most 2,000 are read"),
    ("world in (1, 2)", "'In'; compare with"),
    ("success == 1 & distance > 5", "uses &; write 'and' instead"),
    ("ok | success", "uses |; write 'or' instead"),
    ("~ok", "uses ~; write 'not' instead"),
    ("class > 1", "in backticks: `class` > 1"),
    ("success == 1 and", "(at its end: 'success == 1 and <here>')"),  # was "at character 1"
    ("(success == 1", "('(' was never closed, at character 1"),
    ("`sucess` == 1", "names 'sucess', which is no world variable. Did you mean 'success'?"),
    ("`distance`.real > 1", "'`distance`.real', which a filter cannot contain"),
])
def test_a_bad_expression_is_refused_with_a_message_that_says_why(text, fragment):
    with pytest.raises(SelectionError) as caught:
        evaluate(text, COLUMNS)

    assert fragment in str(caught.value)
