"""Verifiable post-training tasks: generation, the train/test split, solutions and rewards."""

import json
import re

import pytest

from lmforge.errors import LmforgeError
from lmforge.posttrain.tasks import (
    TASKS,
    Arithmetic,
    Countdown,
    Problem,
    combine,
    countdown_reward,
    exact_answer,
    extract_answer,
    format_reward,
    get_task,
    gsm8k_problems,
    read_jsonl,
    split_of,
    write_jsonl,
)
from lmforge.posttrain.tasks.rewards import InvalidExpression, evaluate_expression

STEP = re.compile(r"(\d+(?: [-+*] \d+)+) = (\d+)")


def _left_to_right(expression: str) -> int:
    tokens = expression.split()
    value = int(tokens[0])
    for op, number in zip(tokens[1::2], tokens[2::2], strict=True):
        value = {"+": value + int(number), "-": value - int(number), "*": value * int(number)}[op]
    return value


def _score(task, problem: Problem, completion: str) -> float:
    return task.reward(problem.prompt, completion, **problem.reward_fields())


# --- the split ---------------------------------------------------------------------------


def test_split_of_is_stable_and_about_test_percent():
    keys = [f"arith:{a}+{b}" for a in range(100) for b in range(100)]
    splits = [split_of(k) for k in keys]
    assert splits == [split_of(k) for k in keys]
    assert set(splits) == {"train", "test"}
    assert 0.08 < splits.count("test") / len(keys) < 0.12
    assert {split_of(k, 0) for k in keys[:200]} == {"train"}
    assert {split_of(k, 100) for k in keys[:200]} == {"test"}
    # a larger test share only moves keys from train to test
    assert all(split_of(k, 20) == "test" for k, s in zip(keys, splits, strict=True) if s == "test")
    with pytest.raises(LmforgeError, match="percentage from 0 to 100"):
        split_of("x", 101)


@pytest.mark.parametrize(
    ("task", "n_train", "n_test"), [(Arithmetic(), 3000, 600), (Countdown(), 1500, 200)]
)
def test_train_and_test_never_overlap(task, n_train, n_test):
    train_keys, train_prompts = set(), set()
    test_keys, test_prompts = set(), set()
    for seed in range(3):
        train = task.problems(n_train, "train", seed)
        test = task.problems(n_test, "test", seed)
        assert len({p.key for p in train}) == n_train  # distinct within a list
        assert len({p.key for p in test}) == n_test
        assert all(split_of(p.key) == "train" for p in train)
        assert all(split_of(p.key) == "test" for p in test)
        train_keys |= {p.key for p in train}
        test_keys |= {p.key for p in test}
        train_prompts |= {p.prompt for p in train}
        test_prompts |= {p.prompt for p in test}
    assert train_keys and test_keys
    assert not train_keys & test_keys
    assert not train_prompts & test_prompts


@pytest.mark.parametrize("name", sorted(TASKS))
def test_problems_are_deterministic_per_seed(name):
    task = get_task(name)
    first = [p.to_json() for p in task.problems(200, "train", 7)]
    assert first == [p.to_json() for p in get_task(name).problems(200, "train", 7)]
    assert first != [p.to_json() for p in task.problems(200, "train", 8)]
    assert first[:50] == [p.to_json() for p in task.problems(50, "train", 7)]


def test_an_exhausted_split_says_so():
    # one-digit sums: 100 additions and 55 subtractions, about 15 of them test problems
    with pytest.raises(LmforgeError, match="test split has no more distinct problems.*max_digits"):
        Arithmetic(max_digits=1).problems(100, "test", 0)
    assert len(Arithmetic(max_digits=1).problems(5, "test", 0)) == 5


def test_bad_arguments_are_user_errors():
    with pytest.raises(LmforgeError, match="unknown split 'dev'"):
        Arithmetic().problems(3, "dev", 0)
    with pytest.raises(LmforgeError, match="ops is '\\+/'"):
        Arithmetic(ops="+/")
    with pytest.raises(LmforgeError, match="max_digits is 0"):
        Arithmetic(max_digits=0)
    with pytest.raises(LmforgeError, match="n_numbers is 1"):
        Countdown(n_numbers=1)


# --- arithmetic ---------------------------------------------------------------------------


def _check_columns(solution: str, op: str) -> None:
    """Each column's sum is right and a carry (borrow) shows up in the next column."""
    body = solution.split(": ", 1)[1].split(" So ")[0]
    columns = [c for c in body.split(". ") if c]
    owed = False
    for column in columns:
        equation = STEP.search(column)
        assert equation, column
        assert _left_to_right(equation.group(1)) == int(equation.group(2)), column
        assert len(equation.group(1).split()) == (5 if owed else 3), solution
        assert (" + 1 = " if op == "+" else " - 1 - ") in column or not owed, solution
        owed = "carry 1" in column or "borrow 1" in column


@pytest.mark.parametrize("ops", ["+-", "+", "-"])
@pytest.mark.parametrize("max_digits", [1, 2, 3])
def test_arithmetic_solutions_are_right(ops, max_digits):
    task = Arithmetic(max_digits=max_digits, ops=ops)
    n = 40 if max_digits == 1 else 400
    for problem in task.problems(n, "train", 0):
        a, op, b = problem.fields["a"], problem.fields["op"], problem.fields["b"]
        assert op in ops
        value = a + b if op == "+" else a - b
        assert value >= 0
        assert problem.answer == str(value)
        assert problem.key == f"arith:{a}{op}{b}"
        assert re.findall(r"\d+", problem.prompt) == [str(a), str(b)]
        assert problem.solution.endswith(f"So {a} {op} {b} = {value}.\n#### {value}")
        assert extract_answer(problem.solution) == str(value)
        assert exact_answer(problem.prompt, problem.solution, problem.answer) == 1.0
        assert format_reward(problem.prompt, problem.solution) == 1.0
        _check_columns(problem.solution, op)
        # the written digits, read back from the last column, are the result
        written = re.findall(r"write (\d)", problem.solution)
        last = STEP.findall(problem.solution.split(" So ")[0])[-1][1]
        assert int(last + "".join(reversed(written))) == value


def test_arithmetic_examples_and_lengths():
    from lmforge.posttrain.tasks.arithmetic import solve

    assert solve(37, "+", 58)[0] == (
        "37 + 58: 7 + 8 = 15, write 5 carry 1. 3 + 5 + 1 = 9. So 37 + 58 = 95.\n#### 95"
    )
    assert solve(95, "-", 58)[0] == (
        "95 - 58: 15 - 8 = 7, write 7 borrow 1. 9 - 1 - 5 = 3. So 95 - 58 = 37.\n#### 37"
    )
    assert solve(100, "-", 99)[1] == 1
    problems = Arithmetic().problems(3000, "train", 1)
    assert max(len(p.solution) for p in problems) <= 120
    assert {p.fields["op"] for p in problems} == {"+", "-"}
    assert max(p.fields["a"] for p in problems) >= 90


def test_wrong_arithmetic_answers_score_zero():
    task = Arithmetic()
    for problem in task.problems(100, "test", 0):
        right = int(problem.answer)
        wrong = problem.solution.rsplit("#### ", 1)[0] + f"#### {right + 1}"
        assert exact_answer(problem.prompt, wrong, problem.answer) == 0.0
        assert _score(task, problem, wrong) == pytest.approx(0.1)  # format only
        assert _score(task, problem, problem.solution) == pytest.approx(1.1)
        assert _score(task, problem, "I do not know") == 0.0


# --- countdown ----------------------------------------------------------------------------


@pytest.mark.parametrize(("n_numbers", "max_number"), [(3, 10), (2, 20), (4, 12)])
def test_countdown_solutions_are_right(n_numbers, max_number):
    task = Countdown(n_numbers=n_numbers, max_number=max_number)
    for problem in task.problems(300, "train", 0):
        numbers, target = problem.fields["numbers"], problem.fields["target"]
        assert len(numbers) == n_numbers
        assert all(1 <= x <= max_number for x in numbers)
        assert target > 0
        assert problem.prompt == (
            f"Using the numbers {', '.join(map(str, numbers))} each at most once with + - *, "
            f"make {target}."
        )
        assert extract_answer(problem.solution) == problem.answer
        assert evaluate_expression(problem.answer, numbers) == target
        assert countdown_reward(problem.prompt, problem.solution, **problem.reward_fields()) == 1
        assert exact_answer(problem.prompt, problem.solution, problem.answer) == 1.0
        assert _score(task, problem, problem.solution) == pytest.approx(1.1)
        steps = STEP.findall(problem.solution)
        assert len(steps) == n_numbers - 1
        assert all(_left_to_right(lhs) == int(rhs) >= 0 for lhs, rhs in steps)
        assert int(steps[-1][1]) == target
        assert json.loads(json.dumps(problem.to_json()))["fields"] == problem.fields


def test_countdown_brackets_only_where_needed():
    from lmforge.posttrain.tasks.countdown import _join, _Node

    def num(n):
        return _Node(n, str(n), 3)

    assert _join(num(5), "*", _join(num(6), "-", num(2))).text == "5*(6-2)"
    assert _join(num(9), "-", _join(num(6), "-", num(2))).text == "9-(6-2)"
    assert _join(num(9), "+", _join(num(6), "-", num(2))).text == "9+6-2"
    assert _join(_join(num(9), "-", num(6)), "-", num(2)).text == "9-6-2"
    assert _join(num(9), "-", _join(num(6), "*", num(2))).text == "9-6*2"


def test_countdown_reward_checks_by_evaluating():
    fields = {"answer": "3*7+2", "numbers": [3, 7, 2], "target": 23}
    assert countdown_reward("", "#### 3*7+2", **fields) == 1.0
    assert countdown_reward("", "#### 2+7*3", **fields) == 1.0  # another valid expression
    assert countdown_reward("", "#### (3 * 7) + 2.", **fields) == 1.0
    assert countdown_reward("", "#### 3*7", **fields) == 0.0  # valid, wrong value
    assert countdown_reward("", "#### 23", **fields) == 0.0  # 23 is not a given number
    assert countdown_reward("", "3*7+2", **fields) == 0.0  # no answer line
    assert countdown_reward("", "#### 3*7+", **fields) == 0.0
    with pytest.raises(LmforgeError, match="needs the problem's numbers and target"):
        countdown_reward("", "#### 3*7+2", answer="3*7+2")


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "x+1",
        "(3).real",
        "abs(3)",
        "3*7+5",  # 5 not given
        "3*3+2",  # 3 used twice
        "7*7*7",
        "21//7+2",
        "21/7+2",
        "3**7",
        "9**9**9**9",
        "-3+7",
        "3.0*7+2",
        "True+2",
        "0x3*7+2",
        "3*7+2;1",
        "[3, 7]",
        "lambda: 3",
        "(" * 300 + "3" + ")" * 300,
        "+".join(["1"] * 200),
    ],
)
def test_countdown_evaluation_refuses_anything_else(expression):
    with pytest.raises(InvalidExpression):
        evaluate_expression(expression, [3, 7, 2])
    assert countdown_reward("", f"#### {expression}", numbers=[3, 7, 2], target=23) == 0.0


def test_countdown_evaluation_allows_repeats_given_as_repeats():
    assert evaluate_expression("7*7-1", [7, 1, 7]) == 48
    assert evaluate_expression(" ( 7 - 1 ) * 7 ", [7, 1, 7]) == 42
    assert evaluate_expression("7", [7, 1, 7]) == 7  # at most once: a subset is fine


# --- rewards ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("#### 1,234.", "1234"),
        ("steps\n#### 95", "95"),
        ("#### 1\nmore\n#### 2 \n", "2"),
        ("#### 7 and then\nnext line", "7 and then"),
        ("no answer here", None),
        ("####", None),
        ("#### .", None),
        ("#### -3.5", "-3.5"),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        ("#### 95", "95", 1.0),
        ("#### 95.0", "95", 1.0),
        ("#### 1,234", "1234", 1.0),
        ("#### 96", "95", 0.0),
        ("#### -95", "95", 0.0),
        ("95", "95", 0.0),
        ("#### ninety-five", "95", 0.0),
        ("#### 3*7+2", "3*7+2", 1.0),
        ("#### 3*7+2", "2+7*3", 0.0),
    ],
)
def test_exact_answer(completion, answer, score):
    assert exact_answer("prompt", completion, answer) == score
    assert exact_answer("prompt", completion, answer=answer, numbers=[1], target=2) == score


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("7 + 8 = 15.\n#### 15", 1.0),
        ("#### 15", 1.0),
        ("steps\n#### 15\n\n", 1.0),
        ("steps\n#### 15\nmore text", 0.0),
        ("#### 14\n#### 15", 0.0),
        ("steps #### 15", 0.0),
        ("steps\n####", 0.0),
        ("steps\n#### ", 0.0),
        ("15", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(completion, score):
    assert format_reward("prompt", completion, answer="15") == score


def test_combine_weights_and_breakdown():
    def one(prompt, completion, **fields):
        return 1.0

    def half(prompt, completion, **fields):
        return 0.5 if fields["answer"] == "x" else 0.0

    reward = combine([(one, 2.0), (half, 0.5)])
    assert reward("p", "c", answer="x") == pytest.approx(2.25)
    assert reward("p", "c", answer="y") == pytest.approx(2.0)
    assert reward.breakdown("p", "c", answer="x") == {"one": 1.0, "half": 0.5}
    assert "2*one" in repr(reward)
    both = combine([(exact_answer, 1.0), (format_reward, 0.1)])
    assert both("p", "#### 5", answer="5") == pytest.approx(1.1)
    assert both("p", "#### 5\nbye", answer="5") == pytest.approx(1.0)
    assert both("p", "#### 4", answer="5") == pytest.approx(0.1)
    with pytest.raises(LmforgeError, match="no rewards"):
        combine([])
    with pytest.raises(LmforgeError, match="pairs"):
        combine([one])


# --- the registry, problems and files -----------------------------------------------------


def test_get_task():
    assert set(TASKS) == {"arithmetic", "countdown"}
    assert isinstance(get_task("arithmetic"), Arithmetic)
    assert get_task("countdown").name == "countdown"
    with pytest.raises(LmforgeError, match="unknown task 'sudoku'; choose one of arithmetic, "):
        get_task("sudoku")


def test_problem_json_and_files_round_trip(tmp_path):
    problems = Countdown().problems(20, "test", 0) + Arithmetic().problems(20, "test", 0)
    first = problems[0]
    assert first.messages() == [
        {"role": "user", "content": first.prompt},
        {"role": "assistant", "content": first.solution},
    ]
    record = first.to_json()
    assert set(record) >= {"messages", "answer", "fields"}
    assert Problem.from_json(record) == first
    path = write_jsonl(problems, tmp_path / "out" / "test.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 40
    assert json.loads(lines[0]) == record
    assert read_jsonl(path) == problems
    assert sorted(p.name for p in path.parent.iterdir()) == ["test.jsonl"]  # no temporary left

    def broken():
        yield problems[0]
        raise RuntimeError("generator failed")

    with pytest.raises(RuntimeError):
        write_jsonl(broken(), path)
    assert read_jsonl(path) == problems  # the old file stands, and no temporary is left
    assert sorted(p.name for p in path.parent.iterdir()) == ["test.jsonl"]
    with pytest.raises(LmforgeError, match="not a problem record"):
        Problem.from_json({"answer": "1"})


# --- GSM8K --------------------------------------------------------------------------------

GSM8K = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half "
        "as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A shop sells 1,200 pens a day. How many in 2 days?",
        "answer": "1200 * 2 = <<1200*2=2400>>2400\n#### 2,400",
    },
]


def test_gsm8k_from_a_local_file(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K) + "\n")
    problems = gsm8k_problems(str(path), "test")
    assert [p.answer for p in problems] == ["72", "2400"]
    assert problems[0].prompt == GSM8K[0]["question"]
    assert "<<" not in problems[0].solution
    assert "48/2 = 24 clips" in problems[0].solution
    assert problems[0].solution.endswith("#### 72")
    assert all(exact_answer(p.prompt, p.solution, p.answer) == 1.0 for p in problems)
    assert all(format_reward(p.prompt, p.solution) == 1.0 for p in problems)
    assert gsm8k_problems(str(path), "test", 1) == problems[:1]
    raw = gsm8k_problems(str(path), "test", strip_calculator=False)
    assert "<<48/2=24>>" in raw[0].solution
    # a folder holds the release's train.jsonl and test.jsonl
    assert gsm8k_problems(str(tmp_path), "test") == problems
    with pytest.raises(LmforgeError, match="has 2 test problems, not 3"):
        gsm8k_problems(str(path), "test", 3)
    with pytest.raises(LmforgeError, match="no GSM8K file"):
        gsm8k_problems(str(tmp_path), "train")


def test_gsm8k_bad_records(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "no final line"}) + "\n")
    with pytest.raises(LmforgeError, match="bad.jsonl:1: its answer has no final '#### N'"):
        gsm8k_problems(str(path), "train")
    path.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(LmforgeError, match="lacks a text 'question' and 'answer'"):
        gsm8k_problems(str(path), "train")
    path.write_text("{not json\n")
    with pytest.raises(LmforgeError, match="bad.jsonl:1 is not JSON"):
        gsm8k_problems(str(path), "train")
