"""Write the toy GRPO problems (falsify/llm/evalset/toy-code-problems.jsonl): one-expression
bodies, five unit tests each computed from the canonical body.
Usage: make_toy_problems.py OUT.jsonl"""

import json
import sys

P = [
    ("identity", "x", "Return x unchanged.", "x", ["1", "'a'", "[2, 3]", "None", "0.5"]),
    ("nothing", "x", "Return None.", "None", ["1", "'a'", "[2, 3]", "None", "0"]),
    ("yes", "x", "Return True.", "True", ["1", "'a'", "[]", "None", "0"]),
    ("no", "x", "Return False.", "False", ["1", "'a'", "[]", "None", "0"]),
    ("zero", "x", "Return 0.", "0", ["1", "'a'", "[]", "None", "0"]),
    ("is_none", "x", "Return True if x is None.", "x is None", ["None", "0", "''", "None", "1"]),
    ("is_empty", "xs", "Return True if xs is empty.", "not xs", ["[]", "[1]", "''", "'a'", "()"]),
    ("is_even", "n", "Return True if n is even.", "n % 2 == 0", ["0", "1", "2", "7", "10"]),
    ("is_odd", "n", "Return True if n is odd.", "n % 2 == 1", ["0", "1", "2", "7", "9"]),
    (
        "is_positive",
        "x",
        "Return True if x is greater than 0.",
        "x > 0",
        ["1", "-1", "0", "5", "3"],
    ),
    ("is_negative", "x", "Return True if x is less than 0.", "x < 0", ["1", "-1", "0", "-5", "-3"]),
    ("is_zero", "x", "Return True if x is 0.", "x == 0", ["1", "0", "0", "-5", "0.0"]),
    (
        "contains",
        "xs, x",
        "Return True if x is in xs.",
        "x in xs",
        ["[1, 2], 1", "[], 0", "'abc', 'b'", "[3], 4", "(1,), 1"],
    ),
    ("absolute", "x", "Return the absolute value of x.", "abs(x)", ["1", "-2", "0", "3.5", "-7"]),
    ("negate", "x", "Return -x.", "-x", ["1", "-2", "0", "3.5", "100"]),
    ("increment", "x", "Return x plus 1.", "x + 1", ["1", "-2", "0", "3", "99"]),
    ("double", "x", "Return x times 2.", "x * 2", ["1", "-2", "0", "3", "'ab'"]),
    ("square", "x", "Return x times x.", "x * x", ["1", "-2", "0", "3", "5"]),
    (
        "length",
        "xs",
        "Return the number of items in xs.",
        "len(xs)",
        ["[]", "[1]", "[1, 2, 3]", "'abcd'", "(5, 6)"],
    ),
    (
        "first",
        "xs",
        "Return the first item of xs.",
        "xs[0]",
        ["[1, 2]", "'xyz'", "[[3], 4]", "(7,)", "[0, 9]"],
    ),
    (
        "last",
        "xs",
        "Return the last item of xs.",
        "xs[-1]",
        ["[1, 2]", "'xyz'", "[3]", "(7, 8, 9)", "[0, 0, 5]"],
    ),
    ("to_str", "x", "Return x as a string.", "str(x)", ["1", "'a'", "None", "2.5", "[1]"]),
    ("upper", "s", "Return s in upper case.", "s.upper()", ["'a'", "'AB'", "''", "'xyz'", "'Q1'"]),
    ("lower", "s", "Return s in lower case.", "s.lower()", ["'A'", "'ab'", "''", "'XYZ'", "'q1'"]),
    (
        "total",
        "xs",
        "Return the sum of the numbers in xs.",
        "sum(xs)",
        ["[]", "[1]", "[1, 2, 3]", "[-1, 1]", "[5, 5]"],
    ),
    (
        "reverse",
        "xs",
        "Return xs reversed.",
        "xs[::-1]",
        ["[1, 2]", "'aba'", "[]", "[3]", "(1, 2, 3)"],
    ),
]
P2 = [
    ("add", "a, b", "Return a plus b.", "a + b", ["1, 2", "0, 0", "-1, 1", "'a', 'b'", "2.5, 2.5"]),
    (
        "maximum",
        "a, b",
        "Return the larger of a and b.",
        "max(a, b)",
        ["1, 2", "3, 1", "0, 0", "-1, -2", "5, 5"],
    ),
    (
        "minimum",
        "a, b",
        "Return the smaller of a and b.",
        "min(a, b)",
        ["1, 2", "3, 1", "0, 0", "-1, -2", "5, 5"],
    ),
    (
        "get",
        "d, key",
        "Return the value of key in the dict d, or None if it is missing.",
        "d.get(key)",
        ["{'a': 1}, 'a'", "{}, 'a'", "{1: 2}, 1", "{'b': 0}, 'c'", "{'x': [1]}, 'x'"],
    ),
]
out = []
for name, args, doc, expr, cases in P + P2:
    prompt = f'def {name}({args}):\n    """{doc}"""\n    return'
    body = f" {expr}\n"
    ns = {}
    exec(f"def {name}({args}):\n    return{body}", ns)
    f = ns[name]
    lines = []
    for c in cases:
        v = eval(f"f({c})", {"f": f})
        lines.append(f"    assert candidate({c}) == {v!r}")
    test = "def check(candidate):\n" + "\n".join(lines) + "\n"
    out.append(
        {
            "task_id": f"toy/{name}",
            "prompt": prompt,
            "entry_point": name,
            "canonical_solution": body,
            "test": test,
        }
    )
with open(sys.argv[1], "w") as fh:
    for r in out:
        fh.write(json.dumps(r) + "\n")
print(len(out))
