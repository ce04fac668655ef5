"""A calculator the model can trust with arithmetic it is bad at.

Expressions are parsed into a syntax tree and walked by `simpleeval` with a short allowlist of
nodes, operators, functions and constants: no names beyond those, no attributes, subscripts,
strings, comprehensions or calls of anything else, so nothing in the expression can reach
Python objects. Inputs are bounded (length, nesting, the size of every intermediate integer)
so that `9**9**9` or `factorial(10**6)` is refused instead of pinning a CPU.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

import simpleeval

from plugins.sdk import Plugin, Tool, ToolContext, ToolError

MAX_EXPRESSION_CHARS = 500
# Past this many bits an integer stops being arithmetic and becomes a memory/CPU attack;
# 4096 bits is about 1233 decimal digits.
MAX_INTEGER_BITS = 4096
# The evaluator recurses twice per level of the tree: well below Python's recursion limit
# (a sum of 200 terms is 200 levels deep).
MAX_DEPTH = 200
MAX_FACTORIAL = 450  # 450! is about 3,700 bits
# Decimal digits of a float in the answer: what a double actually holds.
FLOAT_SIGNIFICANT_DIGITS = 15

Number = int | float


def _check_number(value: Any) -> Number:
    """Every value the walk produces must be a real number of bounded size."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError("Only numbers can be computed here.")
    if isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
        raise ToolError("The number is too large to compute.")
    return value


def _power(base: Number, exponent: Number) -> Number:
    # Estimate the result's size before computing it: `2**10**6` is refused in microseconds
    # instead of being evaluated and then measured.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent * math.log2(abs(base)) > MAX_INTEGER_BITS
    ):
        raise ToolError("The result would be too large to compute.")
    try:
        result = base**exponent
    except OverflowError as exc:
        raise ToolError("The result is too large for a floating-point number.") from exc
    except ZeroDivisionError as exc:
        raise ToolError("Division by zero.") from exc
    if isinstance(result, complex):
        raise ToolError("The result is not a real number.")
    return _check_number(result)


def _multiply(left: Number, right: Number) -> Number:
    if (
        isinstance(left, int)
        and isinstance(right, int)
        and left.bit_length() + right.bit_length() > MAX_INTEGER_BITS + 1
    ):
        raise ToolError("The result would be too large to compute.")
    return _check_number(left * right)


def _divide(left: Number, right: Number) -> Number:
    try:
        return _check_number(left / right)
    except ZeroDivisionError as exc:
        raise ToolError("Division by zero.") from exc


def _floor_divide(left: Number, right: Number) -> Number:
    try:
        return _check_number(left // right)
    except ZeroDivisionError as exc:
        raise ToolError("Division by zero.") from exc


def _modulo(left: Number, right: Number) -> Number:
    try:
        return _check_number(left % right)
    except ZeroDivisionError as exc:
        raise ToolError("Division by zero.") from exc


def _factorial(value: Number) -> int:
    if isinstance(value, float):
        if not value.is_integer():
            raise ToolError("factorial() takes a whole number.")
        value = int(value)
    if value < 0:
        raise ToolError("factorial() takes a number that is not negative.")
    if value > MAX_FACTORIAL:
        raise ToolError(f"factorial() is limited to {MAX_FACTORIAL}.")
    return math.factorial(value)


def _log(value: Number, base: Number | None = None) -> float:
    return math.log(value) if base is None else math.log(value, base)


def _round(value: Number, digits: int = 0) -> Number:
    if not isinstance(digits, int) or abs(digits) > 100:
        raise ToolError("round() takes a whole number of digits between -100 and 100.")
    return round(value, digits) if digits else round(value)


OPERATORS: dict[type[ast.AST], Callable[..., Any]] = {
    ast.Add: lambda a, b: _check_number(a + b),
    ast.Sub: lambda a, b: _check_number(a - b),
    ast.Mult: _multiply,
    ast.Div: _divide,
    ast.FloorDiv: _floor_divide,
    ast.Mod: _modulo,
    ast.Pow: _power,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "cbrt": lambda x: math.copysign(abs(x) ** (1 / 3), x),
    "exp": math.exp,
    "log": _log,
    "ln": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "atan2": math.atan2,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "degrees": math.degrees,
    "radians": math.radians,
    "hypot": math.hypot,
    "abs": abs,
    "round": _round,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": _factorial,
    "gcd": math.gcd,
    "min": min,
    "max": max,
}

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


class _Evaluator(simpleeval.SimpleEval):
    """simpleeval restricted to numbers, the operators above and calls of named functions."""

    def __init__(self) -> None:
        super().__init__(operators=OPERATORS, functions=FUNCTIONS, names=CONSTANTS)
        # Every other kind of node (attributes, subscripts, comprehensions, strings, ...) is
        # refused by simpleeval as "not available".
        self.nodes = {
            ast.Expr: self._eval_expr,
            ast.Constant: self._eval_constant,
            ast.Name: self._eval_name,
            ast.UnaryOp: self._eval_unaryop,
            ast.BinOp: self._eval_binop,
            ast.Call: self._eval_call,
        }

    def _eval_constant(self, node: Any) -> Any:
        return _check_number(node.value)

    def _eval_name(self, node: Any) -> Any:
        if node.id not in CONSTANTS:
            known = ", ".join(sorted(CONSTANTS))
            raise ToolError(f"Unknown name '{node.id}'. Constants: {known}.")
        return CONSTANTS[node.id]

    def _eval_call(self, node: Any) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            known = ", ".join(sorted(FUNCTIONS))
            raise ToolError(f"Unknown function. Functions: {known}.")
        if node.keywords:
            raise ToolError("Functions take positional arguments only.")
        args = [self._eval(arg) for arg in node.args]
        try:
            return _check_number(FUNCTIONS[node.func.id](*args))
        except ToolError:
            raise
        except (ValueError, TypeError) as exc:
            raise ToolError(f"{node.func.id}(): {exc}") from exc


def _depth(root: ast.AST) -> int:
    """How deep the syntax tree goes (walked without recursion, so any depth is safe)."""
    deepest = 0
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression, or ToolError saying what is wrong with it."""
    expression = expression.strip()
    if not expression:
        raise ToolError("The expression is empty.")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"The expression is longer than {MAX_EXPRESSION_CHARS} characters.")
    # People write powers with a caret (in Python `^` is XOR, never what is meant) and
    # multiply and divide with the signs from school.
    expression = expression.replace("^", "**").replace("\u00d7", "*").replace("\u00f7", "/")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolError("The expression is not valid arithmetic.") from exc
    if _depth(tree.body) > MAX_DEPTH:
        raise ToolError("The expression is nested too deeply.")
    try:
        value = _Evaluator().eval(expression, previously_parsed=tree.body)
    except ToolError:
        raise
    except ZeroDivisionError as exc:
        raise ToolError("Division by zero.") from exc
    except OverflowError as exc:
        raise ToolError("The result is too large for a floating-point number.") from exc
    except simpleeval.OperatorNotDefined as exc:
        raise ToolError("Operators: + - * / // % ** and parentheses.") from exc
    except simpleeval.InvalidExpression as exc:
        raise ToolError("The expression uses something a calculator does not have.") from exc
    value = _check_number(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("The result is not a finite number.")
    return value


def _format(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.{FLOAT_SIGNIFICANT_DIGITS}g}"


def calculate(ctx: ToolContext, args: dict[str, Any]) -> dict[str, str]:
    """Handler of `calculator`: the expression and its value as text."""
    expression = args.get("expression")
    if not isinstance(expression, str):
        raise ToolError("'expression' must be a string.")
    return {"expression": expression, "result": _format(evaluate(expression))}


plugin = Plugin(
    slug="calculator",
    name="Calculator",
    version="1.0",
    description="Evaluates arithmetic exactly instead of letting the model guess.",
    tools=[
        Tool(
            name="calculator",
            description=(
                "Evaluate an arithmetic expression. Operators: + - * / // % ** (or ^) and "
                "parentheses. Functions: "
                + ", ".join(sorted(FUNCTIONS))
                + ". Constants: pi, e, tau. Angles are in radians."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": "The expression, e.g. 'sqrt(2) * (3 + 4)^2'.",
                        "maxLength": MAX_EXPRESSION_CHARS,
                    }
                },
                "required": ["expression"],
                "additionalProperties": False,
            },
            handler=calculate,
        )
    ],
)
