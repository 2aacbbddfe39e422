"""Filter expressions over world variables (``success == 1 and distance > 5``), parsed
safely: Python's own parser (:mod:`ast`), then only a whitelist of node kinds is
evaluated, column by column with numpy. Nothing is ever passed to ``eval``.

Allowed: names of columns (in backticks where a name is not one Python reads, as pandas'
``query`` takes them: ```class` > 1``, ```wing span` > 2``), numbers, quoted text,
``true`` / ``false`` / ``nan`` / ``inf``,
comparisons (``== != < <= > >=``, chains such as ``0 < x < 1``), ``and`` / ``or`` /
``not``, ``+ - * / %`` and parentheses. ``&``, ``|`` and ``~`` are refused with a hint:
Python applies them before ``==``, so ``a == 1 & b > 5`` would not mean what it reads.

Arithmetic is done in float64, as numpy does it: ``1/0`` is infinity and ``0/0`` NaN
(which compares False), never an error or a wrapped-around integer. Every message is one
line, the filter quoted with its control characters escaped.
"""

from __future__ import annotations

import ast
import difflib
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flyarchive.errors import SelectionError
from flyarchive.view.logs import visible

#: Longest expression accepted, characters; and most nodes in its tree.
MAX_LENGTH = 2000
MAX_NODES = 400

_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Mod: operator.mod,
}
_CONSTANTS = {"true": True, "false": False, "True": True, "False": False, "nan": np.nan,
              "inf": np.inf}
_HOW = ("Write conditions on world variables such as success == 1 and distance > 5 "
        "(== != < <= > >=, and, or, not, parentheses, + - * /; text in quotes; a name that "
        "is a Python keyword or holds spaces in backticks: `class` > 1).")


def evaluate(text: str, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """The rows where ``text`` holds.

    Args:
        text: The expression, e.g. ``"success == 1 and distance > 5"``.
        columns: Column name -> ``(n,)`` values (numbers, bools or text).

    Returns:
        ``(n,)`` bool. NaN compares False (as in numpy).

    Raises:
        SelectionError: text that does not parse (the message points at the place), a
            name that is no column (with the closest names), an operation that is not
            allowed, or a result that is not true/false per row.
    """
    n = len(next(iter(columns.values()))) if columns else 0
    source, names = _backticked(text)
    tree = parse(source)
    result = np.asarray(_Evaluator(text, columns, names).truth(tree.body))
    return np.broadcast_to(result, (n,)).copy()


def parse(text: str) -> ast.Expression:
    """The expression's tree, checked to use only allowed node kinds.

    Raises:
        SelectionError: as :func:`evaluate`.
    """
    if not isinstance(text, str) or not text.strip():
        raise SelectionError(f"The filter {_quoted(text)} is empty. {_HOW}")
    if len(text) > MAX_LENGTH:
        raise SelectionError(f"The filter is {len(text):,} characters long; at most "
                             f"{MAX_LENGTH:,} are read. Write a shorter one.")
    source = " ".join(text.split())  # one line: newlines would make statements
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as err:
        raise SelectionError(_syntax_message(source, err)) from None
    except (RecursionError, MemoryError):  # nested past what Python's parser takes
        raise SelectionError(f"The filter {_quoted(source)} is nested too deep to read. "
                             "Write a shorter one.") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise SelectionError(f"The filter {_quoted(text)} has {len(nodes)} parts; at most "
                             f"{MAX_NODES} are read. Write a shorter one.")
    return tree


#: A quoted text (left as it is) or a name in backticks.
_PIECES = re.compile(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|`([^`]+)`""")


def _backticked(text: Any) -> tuple[Any, dict[str, str]]:
    """``text`` with each name in backticks made an identifier the parser reads, and
    those identifiers' names (text in quotes is left as it is)."""
    if not isinstance(text, str) or "`" not in text:
        return text, {}
    names: dict[str, str] = {}

    def swap(found: re.Match[str]) -> str:
        if found.group(2) is None:
            return found.group(0)
        alias = f"_backticked_{len(names)}_"
        names[alias] = found.group(2)
        return alias

    return _PIECES.sub(swap, text), names


def _quoted(text: str) -> str:
    """The filter as a message quotes it: ``repr``, at most 120 characters."""
    return repr(visible(text, 120)) if isinstance(text, str) else repr(text)


def _syntax_message(source: str, err: SyntaxError) -> str:
    # Python gives offset 0 where the text ended too soon ("success == 1 and")
    at = len(source) if not err.offset else err.offset - 1
    shown = visible(source[max(0, at - 30):at], 40) + " <here> " + visible(source[at:at + 30])
    where = "at its end" if at >= len(source) else f"at character {at + 1}"
    why = f"{err.msg}, " if err.msg and err.msg != "invalid syntax" else ""
    single = _single_equals(source)
    hint = f" Use == to compare: {visible(single, 120)}." if single else ""
    return (f"Cannot read the filter {_quoted(source)} ({why}{where}: "
            f"{shown.strip()!r}). {_HOW}{hint}")


def _single_equals(source: str) -> str | None:
    """``"a = 1"`` -> ``"a == 1"``: the fix for a lone ``=``, if there is one."""
    out, i, changed = [], 0, False
    while i < len(source):
        ch = source[i]
        if ch == "=" and (i == 0 or source[i - 1] not in "=!<>") and source[i + 1:i + 2] != "=":
            out.append("==")
            changed = True
        else:
            out.append(ch)
        i += 1
    return "".join(out) if changed else None


def _kind(value: np.ndarray) -> str:
    if value.dtype.kind in "iuf":
        return "numbers"
    if value.dtype.kind in "USO":
        return "text"
    return f"values of type {value.dtype}"


class _Evaluator:
    """Evaluates an allowed tree over whole columns."""

    def __init__(self, text: str, columns: Mapping[str, np.ndarray],
                 names: Mapping[str, str] | None = None) -> None:
        self.text = text
        self.columns = columns
        self.names = dict(names or {})  # identifiers of names in backticks -> the names

    def visit(self, node: ast.AST) -> Any:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise self._refused(node)
        return method(node)

    def _refused(self, node: ast.AST) -> SelectionError:
        source = " ".join(_backticked(self.text)[0].split())  # as parsed
        piece = ast.get_source_segment(source, node) or type(node).__name__
        for alias, name in self.names.items():
            piece = piece.replace(alias, f"`{name}`")
        return SelectionError(f"The filter {_quoted(self.text)} uses {visible(piece, 60)!r}, "
                              f"which a filter cannot contain. {_HOW}")

    def visit_Name(self, node: ast.Name) -> Any:
        name = self.names.get(node.id, node.id)
        if name in self.columns:
            return np.asarray(self.columns[name])
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        names = list(self.columns)
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6) or \
            [n for n in names if n.lower() == name.lower()]
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise SelectionError(
            f"The filter {_quoted(self.text)} names {visible(name, 60)!r}, which is no world "
            f"variable.{hint} Variables: {', '.join(map(repr, names)) or 'none'}.")

    def visit_Constant(self, node: ast.Constant) -> Any:
        value = node.value
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)):
            try:
                return np.float64(value)  # arithmetic in float64: no overflow, no wrap
            except OverflowError:
                raise SelectionError(
                    f"The filter {_quoted(self.text)} holds a number of {len(str(value))} "
                    "digits, beyond what a float64 holds (about 1.8e308).") from None
        raise SelectionError(f"The filter {_quoted(self.text)} holds {visible(repr(value), 40)}, "
                             f"which is neither a number nor text. {_HOW}")

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        values = [self.truth(v) for v in node.values]
        combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        result = values[0]
        for value in values[1:]:
            result = combine(result, value)
        return result

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        if isinstance(node.op, ast.Invert):
            raise SelectionError(f"The filter {_quoted(self.text)} uses ~; write 'not' instead.")
        if isinstance(node.op, ast.Not):
            return np.logical_not(self.truth(node.operand))
        value = self._number(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        if isinstance(node.op, (ast.BitAnd, ast.BitOr)):  # binds before ==: never what is meant
            word = "and" if isinstance(node.op, ast.BitAnd) else "or"
            raise SelectionError(
                f"The filter {_quoted(self.text)} uses {'&' if word == 'and' else '|'}; write "
                f"{word!r} "
                f"instead (in Python, & and | apply before ==, so 'a == 1 & b > 5' would "
                "compare a with 1 & b).")
        op = _ARITHMETIC.get(type(node.op))
        if op is None:
            raise self._refused(node)
        with np.errstate(all="ignore"):
            return op(self._number(node.left), self._number(node.right))

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        result: Any = True
        for op_node, right_node in zip(node.ops, node.comparators):
            op = _COMPARE.get(type(op_node))
            if op is None:
                raise SelectionError(
                    f"The filter {_quoted(self.text)} uses {type(op_node).__name__!r}; compare "
                    "with == != < <= > >=.")
            right = self.visit(right_node)
            self._comparable(left, right)
            with np.errstate(invalid="ignore"):
                result = np.logical_and(result, op(left, right))
            left = right
        return result

    def _comparable(self, left: Any, right: Any) -> None:
        kinds = {_is_text(left), _is_text(right)}
        if kinds == {True, False}:
            raise SelectionError(
                f"The filter {_quoted(self.text)} compares text with a number. Put text in "
                "quotes on both sides (genotype == \"wt\") and numbers without them.")

    def _number(self, node: ast.AST) -> Any:
        """The node's value as float64 numbers (bools as 0 and 1).

        Raises:
            SelectionError: text.
        """
        value = self.visit(node)
        if _is_text(value):
            raise SelectionError(f"The filter {_quoted(self.text)} does arithmetic on text.")
        return np.asarray(value, dtype=np.float64)

    def truth(self, node: ast.AST) -> Any:
        """The node's value as true/false: bools as they are, numbers ``!= 0`` (a 0/1
        column, e.g. ``success and not fell``).

        Raises:
            SelectionError: text, which has no truth value here.
        """
        value = np.asarray(self.visit(node))
        if value.dtype == bool:
            return value
        if value.dtype.kind in "iuf":
            return value != 0
        raise SelectionError(
            f"The filter {_quoted(self.text)} uses {_kind(value)} as true/false; compare it: "
            "genotype == \"wt\".")


def _is_text(value: Any) -> bool:
    return isinstance(value, str) or np.asarray(value).dtype.kind in "USOT"
