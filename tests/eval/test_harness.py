"""Task specs, request building and scoring rules, on a backend whose answers the test sets."""

import json
import math

import pytest

from lmforge.data import Document
from lmforge.errors import LmforgeError
from lmforge.eval.code_suite import code_suite
from lmforge.eval.harness import run_task, write_results
from lmforge.eval.metrics import mean_stderr, numeric_answer
from lmforge.eval.tasks import TaskSpec, load_docs, load_spec
from lmforge.infer.score import TokenScores


class ScriptedBackend:
    """Log-likelihoods from a table keyed by (context, continuation); generations by context."""

    max_length = 64

    def __init__(self, lls=None, generations=None, tokens=None):
        self.lls, self.generations, self.tokens = lls or {}, generations or {}, tokens or {}
        self.asked = []

    def loglikelihood(self, requests):
        self.asked += requests
        out = []
        for request in requests:
            n = self.tokens.get(request, 1)
            ll = self.lls[request]
            out.append(TokenScores([ll / n] * n, [ll > -1] * n))
        return out

    def generate_until(self, requests, temperature=0.0, samples=1, seed=0):
        from lmforge.eval.backend import Generation

        return [[Generation(self.generations[ctx], [])] for ctx, _until, _n in requests]


def spec(**keys):
    base = dict(task="t", output_type="multiple_choice", dataset_path="x.jsonl")
    return TaskSpec(**{**base, **keys})


def test_multiple_choice_acc_acc_norm_and_per_token_follow_their_definitions():
    docs = [{"q": "Q", "choices": ["a", "bbbbbbbb"], "gold": 1}]
    task = spec(doc_to_text="{{q}}", doc_to_choice="choices", doc_to_target="gold")
    lls = {("Q", " a"): -2.0, ("Q", " bbbbbbbb"): -4.0}
    # acc: a (-2 > -4); acc_norm by characters: -2/1 < -4/8, so b; per token: b's 8 tokens
    backend = ScriptedBackend(lls, tokens={("Q", " a"): 1, ("Q", " bbbbbbbb"): 8})
    result = run_task(backend, task, docs=docs)
    assert result.metrics["acc"] == 0.0
    assert result.metrics["acc_norm"] == 1.0
    assert result.metrics["acc_per_token"] == 1.0
    assert result.baseline == 0.5
    (record,) = result.records
    assert record["loglikelihoods"] == [-2.0, -4.0] and record["prediction"] == 0
    assert record["gold"] == 1 and record["correct"] is False
    assert result.failures() == [record]


def test_schema_picks_the_context_with_the_best_mean_continuation_loss():
    docs = [{"contexts": ["A", "BB"], "cont": "end", "gold": 1}]
    task = spec(
        output_type="schema",
        doc_to_choice="contexts",
        doc_to_continuation="cont",
        doc_to_target="gold",
    )
    backend = ScriptedBackend({("A", " end"): -3.0, ("BB", " end"): -2.0})
    result = run_task(backend, task, docs=docs)
    assert result.metrics["acc"] == 1.0 and result.records[0]["prediction"] == 1


def test_language_modelling_needs_every_token_greedy():
    docs = [{"c": "x", "t": "yes"}, {"c": "z", "t": "no"}]
    task = spec(output_type="language_modeling", doc_to_text="c", doc_to_target="t")
    backend = ScriptedBackend({("x", " yes"): -0.5, ("z", " no"): -3.0})
    result = run_task(backend, task, docs=docs)
    assert result.output_type == "loglikelihood"
    assert result.metrics["acc"] == 0.5
    assert result.metrics["acc_stderr"] == pytest.approx(mean_stderr([1.0, 0.0]))


def test_generation_by_exact_match_and_by_gsm8k_numeric_answer():
    docs = [{"q": "2+2?", "a": "so #### 4"}, {"q": "1+1?", "a": "#### 1,000"}]
    gens = {"2+2?": "we get 2 + 2 = 4", "1+1?": "#### 1000.0"}
    numeric = spec(output_type="generate_until", doc_to_text="q", doc_to_target="a",
                   metric="numeric")  # fmt: skip
    result = run_task(ScriptedBackend(generations=gens), numeric, docs=docs)
    assert result.metrics["numeric"] == 1.0
    exact = spec(output_type="generate_until", doc_to_text="q", doc_to_target="a")
    assert (
        run_task(ScriptedBackend(generations=gens), exact, docs=docs).metrics["exact_match"] == 0.0
    )


def test_numeric_answer():
    assert numeric_answer("a\n#### -3") == "-3"
    assert numeric_answer("costs 1,234.50 then 7") == "7"
    assert numeric_answer("#### 12.0") == "12"
    assert numeric_answer("no number") is None


def test_fewshot_examples_are_seeded_and_never_the_document_itself():
    docs = [{"q": f"q{i}", "choices": ["x", "y"], "gold": i % 2} for i in range(6)]
    task = spec(doc_to_text="{{q}}", doc_to_choice="choices", doc_to_target="gold", num_fewshot=3)
    lls = {(None, None): 0}

    class Recorder(ScriptedBackend):
        def loglikelihood(self, requests):
            self.asked += requests
            return [TokenScores([-1.0], [True]) for _ in requests]

    first, second = Recorder(lls), Recorder(lls)
    run_task(first, task, docs=docs)
    run_task(second, task, docs=docs)
    assert first.asked == second.asked  # the same shots every run
    for i, doc in enumerate(docs):
        context = first.asked[2 * i][0]
        shots = context.split("\n\n")
        assert len(shots) == 4 and shots[-1] == doc["q"]
        assert all(not s.startswith(doc["q"] + " ") for s in shots[:-1])
        assert all(s.split(" ")[1] in ("x", "y") for s in shots[:-1])  # text + delimiter + gold
    with pytest.raises(LmforgeError, match="num-fewshot"):
        run_task(first, task, docs=docs, num_fewshot=6)


def test_rolling_perplexity_metrics():
    class Rolling(ScriptedBackend):
        def loglikelihood_rolling(self, texts):
            return [-len(t) * math.log(2) for t in texts]  # one bit per byte

    docs = [{"text": "abcd"}, {"text": "ef gh"}]
    task = spec(output_type="loglikelihood_rolling", doc_to_target="text")
    result = run_task(Rolling(), task, docs=docs)
    assert result.metrics["bits_per_byte"] == pytest.approx(1.0)
    assert result.metrics["byte_perplexity"] == pytest.approx(2.0)
    assert result.metrics["word_perplexity"] == pytest.approx(math.exp(9 * math.log(2) / 3))


def test_specs_load_from_toml_and_yaml_with_data_beside_them(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"q": "1", "c": ["a", "b"], "g": 0}) + "\n")
    (tmp_path / "t.toml").write_text(
        'task = "mine"\noutput_type = "multiple_choice"\ndataset_path = "d.jsonl"\n'
        'doc_to_text = "{{q}}?"\ndoc_to_choice = "c"\ndoc_to_target = "g"\n'
    )
    (tmp_path / "t.yaml").write_text(
        "task: theirs\noutput_type: multiple_choice\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'd.jsonl'}\n"
        "doc_to_text: '{{q}}?'\ndoc_to_choice: '{{c}}'\ndoc_to_target: '{{g}}'\n"
        "metric_list:\n  - metric: acc\n"
    )
    for name in ("t.toml", "t.yaml"):
        task = load_spec(tmp_path / name)
        (doc,) = load_docs(task)
        assert task.text(doc) == "1?" and task.choices(doc) == ["a", "b"]
        assert task.gold_index(doc) == 0


@pytest.mark.parametrize(
    "body, message",
    [
        ('task = "x"\noutput_type = "mc"\ndataset_path = "d"\n', "output_type 'mc' is unknown"),
        ('task = "x"\noutput_type = "schema"\ndataset_path = "d"\n', "needs doc_to_choice"),
        ('task = "x"\ndataset_path = "d"\n', "has no 'output_type'"),
        ('task = "x"\noutput_type = "code"\ndataset_path = "d"\nshots = 3\n', "unknown keys"),
        ("task = ", "not valid TOML"),
    ],
)
def test_bad_specs_get_one_line_errors(tmp_path, body, message):
    (tmp_path / "t.toml").write_text(body)
    with pytest.raises(LmforgeError, match=message):
        load_spec(tmp_path / "t.toml")


def test_a_bad_data_line_is_named_by_file_and_line(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"q": 1}\n\nnot json\n')
    task = spec(dataset_path="d.jsonl", doc_to_text="q", doc_to_choice="q", doc_to_target="q",
                folder=tmp_path)  # fmt: skip
    with pytest.raises(LmforgeError, match=r"d\.jsonl:3: not a JSON object"):
        load_docs(task)


def test_results_are_written_per_example_and_summarised(tmp_path):
    docs = [{"q": "Q", "choices": ["a", "b"], "gold": 0}]
    task = spec(doc_to_text="q", doc_to_choice="choices", doc_to_target="gold")
    result = run_task(ScriptedBackend({("Q", " a"): -1.0, ("Q", " b"): -2.0}), task, docs=docs)
    summary = json.loads(write_results([result], tmp_path, {"checkpoint": "c"}).read_text())
    assert summary["checkpoint"] == "c"
    assert summary["tasks"][0]["metrics"]["acc"] == 1.0
    assert summary["tasks"][0]["metrics"]["acc_stderr"] is None  # one example: no error
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["correct"] is True
    assert not list(tmp_path.glob("*.tmp"))


def _documents(n=12):
    lines = [f"    value_{i} = compute(items[{i}], scale[{i}])" for i in range(20)]
    lines += [f"    total = total + value_{i}" for i in range(5)]
    return [
        Document(f"f{d}", "\n".join(f"def f{d}_{j}():\n" + "\n".join(lines) for j in range(3)))
        for d in range(n)
    ]


def test_the_code_suite_is_deterministic_with_chance_baselines_and_true_answers():
    first, again = code_suite(_documents(), examples=20), code_suite(_documents(), examples=20)
    assert [t.docs for t in first] == [t.docs for t in again]
    by_name = {t.spec.task: t for t in first}
    assert set(by_name) == {"code_next_line", "code_identifier", "code_closing"}
    assert by_name["code_next_line"].spec.baseline == 0.25
    assert by_name["code_identifier"].spec.baseline == 0.0
    for doc in by_name["code_next_line"].docs:
        assert len(set(doc["choices"])) == 4
    for doc in by_name["code_identifier"].docs:
        assert doc["target"].isidentifier() and not doc["context"].endswith(doc["target"])
    for doc in by_name["code_closing"].docs:
        gold = doc["contexts"][doc["gold"]]
        assert gold.endswith("])") and len(set(doc["contexts"])) == 4
    assert all(len(t.docs) == 20 for t in first)


def test_rolling_windows_equal_lm_evals():
    lm_utils = pytest.importorskip("lm_eval.utils")
    from lmforge.eval.encoding import rolling_windows

    for n in (1, 5, 63, 64, 65, 130, 200):
        for window in (1, 2, 7, 64):
            ids = list(range(100, 100 + n))
            theirs = [
                lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(ids, 7, window, 1)
            ]
            assert rolling_windows(ids, 7, window) == [tuple(w) for w in theirs], (n, window)


def test_a_code_task_runs_each_completion_against_its_tests():
    from lmforge.eval.code_tasks import humaneval_task

    task, problems = humaneval_task()
    problems = problems[:4]
    right = {p["prompt"]: p["canonical_solution"] for p in problems}
    wrong = {p["prompt"]: "    return None\n" for p in problems}
    passed = run_task(ScriptedBackend(generations=right), task, docs=problems)
    failed = run_task(ScriptedBackend(generations=wrong), task, docs=problems)
    assert passed.metrics["pass@1"] == 1.0 and failed.metrics["pass@1"] == 0.0
    assert failed.records[0]["status"] == ["failed"] and not failed.records[0]["correct"]
