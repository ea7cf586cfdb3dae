"""`lmforge eval` agrees with lm-evaluation-harness on the same model, four ways.

One local multiple-choice task, one generation task and one rolling-loglikelihood task (lm-eval
task YAMLs over JSONL files, offline) are run by:
- lm-eval's `hf` backend on the checkpoint exported to Hugging Face's layout (transformers),
- lm-eval with lmforge's model class (`model="lmforge"`),
- lm-eval's `local-completions` against `lmforge serve` (`tokenizer_backend=remote`),
- `lmforge eval`'s own harness.
Per-example log-likelihoods agree within 1e-4, generations and accuracies exactly.

Every route starts a request with `<|endoftext|>`, lmforge's document start
(lmforge.tokens.encode.document_start): the hf backend through the exported tokenizer's own
special tokens, lmforge's harness by default, and the served path through the server's
`/tokenize`, which lm-eval's remote tokenizer encodes with. lmforge's `add_bos=False` (the hf
backend's `add_bos_token=False`) leaves it out, checked too. The API backends also keep a
token for generation and cut requests to max_length - 1 tokens and rolling windows to
max_length - 2 (lm-eval's api_models.py), so the served path is compared with the others run
with max_length = CONTEXT - 2, the windows lm-eval's API backend uses against a CONTEXT-token
server, and on the questions that fit every window also with their full-context scores.
"""

import json
import os

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")  # a dev dependency: this runs in make test

from lm_eval.tasks import TaskManager  # noqa: E402

import lmforge.eval.lm_eval_model  # noqa: E402, F401  (registers model="lmforge")
from lmforge.eval.backend import EngineBackend  # noqa: E402
from lmforge.eval.harness import run_task  # noqa: E402
from lmforge.eval.tasks import load_spec  # noqa: E402
from lmforge.infer.engine import Engine  # noqa: E402
from lmforge.infer.server import create_app, running  # noqa: E402
from lmforge.model import ModelConfig, Transformer  # noqa: E402
from lmforge.model.hf import export_hf  # noqa: E402
from lmforge.tokenizer import Tokenizer  # noqa: E402
from lmforge.train.checkpoint import save_checkpoint  # noqa: E402

CONTEXT = 64  # short, so long documents and contexts are cut and windowed
API_WINDOW = CONTEXT - 2  # what lm-eval's API backends window a CONTEXT-token server's requests to
LONG_QUESTION = 1  # the multiple-choice question longer than every window
TASKS = ("agree_mc", "agree_gen", "agree_rolling")
LINES = [
    "def add(a, b):",
    "    return a + b",
    "import os",
    "for i in range(10):",
    "class Stack:",
    "    def __init__(self):",
    "        self.items = []",
    "if __name__ == '__main__':",
    "    main()",
    "x = [1, 2, 3]",
]


def _write_tasks(folder):
    mc = [
        {
            "question": LINES[i] + "\n" + LINES[(i + 1) % 10] + (" " if i % 3 == 0 else ""),
            "choices": [LINES[(i + k) % 10] for k in (2, 5, 7, 9)],
            "answer": i % 4,
        }
        for i in range(10)
    ]
    mc[0]["question"] = ""  # an empty context: lm-eval starts it with the prefix token
    mc[LONG_QUESTION]["question"] = "\n".join(LINES * 3)  # longer than the window: cut
    gen = [{"prompt": LINES[i] + "\n", "target": LINES[(i + 1) % 10]} for i in range(6)]
    rolling = [{"text": "\n".join(LINES[i:] + LINES[:i]) * (1 + i % 3)} for i in range(5)]
    for name, docs in (("mc", mc), ("gen", gen), ("rolling", rolling)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = "dataset_path: json\ntest_split: test\n"
    (folder / "agree_mc.yaml").write_text(
        "task: agree_mc\noutput_type: multiple_choice\n"
        + common
        + f"dataset_kwargs:\n  data_files:\n    test: {folder / 'mc.jsonl'}\n"
        + "doc_to_text: '{{question}}'\ndoc_to_choice: choices\ndoc_to_target: answer\n"
        + "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (folder / "agree_gen.yaml").write_text(
        "task: agree_gen\noutput_type: generate_until\n"
        + common
        + f"dataset_kwargs:\n  data_files:\n    test: {folder / 'gen.jsonl'}\n"
        + "doc_to_text: prompt\ndoc_to_target: target\ntarget_delimiter: ''\n"
        + "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
        + "metric_list:\n  - metric: exact_match\n"
    )
    (folder / "agree_rolling.yaml").write_text(
        "task: agree_rolling\noutput_type: loglikelihood_rolling\n"
        + common
        + f"dataset_kwargs:\n  data_files:\n    test: {folder / 'rolling.jsonl'}\n"
        + "doc_to_text: ''\ndoc_to_target: text\n"
        + "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n"
    )


@pytest.fixture(scope="module")
def setup(prepared, tmp_path_factory):
    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=CONTEXT,
    )
    model = Transformer(config).eval()
    root = tmp_path_factory.mktemp("agree")
    checkpoint = save_checkpoint(
        root / "ckpt",
        1,
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        {},
        {},
        {},
        prepared.tokenizer_dir,
    )
    hf_dir = export_hf(model, tokenizer, root / "hf")
    tasks = root / "tasks"
    tasks.mkdir()
    _write_tasks(tasks)
    return checkpoint, hf_dir, tasks, model, tokenizer


def _lm_eval(model, model_args, tasks):
    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=list(TASKS),
        # Only the local tasks: indexing lm-eval's thousands of built-in task YAMLs as well
        # took 7 s of CPU per call.
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
        batch_size=4,
        device="cpu",
    )
    return _per_example(out["samples"]), out["results"]


def _per_example(samples):
    """task -> per-example answers: choice lls (mc), text (gen), ll (rolling)."""
    out = {}
    for task, rows in samples.items():
        rows = sorted(rows, key=lambda r: r["doc_id"])
        if task == "agree_mc":
            out[task] = [[float(r[0][0]) for r in row["resps"]] for row in rows]
        elif task == "agree_gen":
            out[task] = [row["filtered_resps"][0] for row in rows]
        else:
            out[task] = [float(row["resps"][0][0]) for row in rows]
    return out


def _lmforge(checkpoint, tasks, add_bos=True, max_length=None):
    answers, accuracy = {}, {}
    backend = EngineBackend.from_checkpoint(checkpoint, add_bos=add_bos, max_length=max_length)
    with backend:
        for task in TASKS:
            result = run_task(backend, load_spec(tasks / f"{task}.yaml"))
            records = result.records
            if task == "agree_mc":
                answers[task] = [r["loglikelihoods"] for r in records]
                accuracy[task] = (result.metrics["acc"], result.metrics["acc_norm"])
            elif task == "agree_gen":
                answers[task] = [r["generation"] for r in records]
                accuracy[task] = result.metrics["exact_match"]
            else:
                answers[task] = [r["loglikelihood"] for r in records]
                accuracy[task] = result.metrics["bits_per_byte"]
    return answers, accuracy


def _same(reference, answers):
    for task in TASKS:
        ref, got = reference[task], answers[task]
        assert len(ref) == len(got), task
        if task == "agree_gen":
            assert got == ref
        else:
            assert torch.allclose(
                torch.tensor(got, dtype=torch.float64),
                torch.tensor(ref, dtype=torch.float64),
                atol=1e-4,
                rtol=0,
            ), task


def _accuracies(results):
    return {
        "agree_mc": (results["agree_mc"]["acc,none"], results["agree_mc"]["acc_norm,none"]),
        "agree_gen": results["agree_gen"]["exact_match,none"],
        "agree_rolling": results["agree_rolling"]["bits_per_byte,none"],
    }


@pytest.fixture(scope="module")
def reference(setup):
    _checkpoint, hf_dir, tasks, *_ = setup
    return _lm_eval("hf", f"pretrained={hf_dir},dtype=float32", tasks)


@pytest.fixture(scope="module")
def reference_no_bos(setup):
    _checkpoint, hf_dir, tasks, *_ = setup
    args = f"pretrained={hf_dir},dtype=float32,add_bos_token=False,max_length={API_WINDOW}"
    return _lm_eval("hf", args, tasks)


@pytest.mark.parametrize("add_bos", [True, False])
def test_lmforge_eval_equals_lm_eval_hf(setup, reference, reference_no_bos, add_bos):
    checkpoint, _, tasks, *_ = setup
    answers, accuracy = _lmforge(checkpoint, tasks, add_bos, None if add_bos else API_WINDOW)
    expected = reference if add_bos else reference_no_bos
    _same(expected[0], answers)
    ref = _accuracies(expected[1])
    assert accuracy["agree_mc"] == ref["agree_mc"]
    assert accuracy["agree_gen"] == ref["agree_gen"]
    assert accuracy["agree_rolling"] == pytest.approx(ref["agree_rolling"], abs=1e-6)
    if add_bos:  # the conventions differ, so the test above could tell them apart
        assert not torch.allclose(
            torch.tensor(reference[0]["agree_rolling"]),
            torch.tensor(reference_no_bos[0]["agree_rolling"]),
            atol=1e-3,
        )


def test_lm_eval_with_lmforge_model_class_equals_hf(setup, reference):
    checkpoint, _, tasks, *_ = setup
    answers, results = _lm_eval("lmforge", f"checkpoint={checkpoint}", tasks)
    _same(reference[0], answers)
    assert _accuracies(results)["agree_mc"] == _accuracies(reference[1])["agree_mc"]


@pytest.fixture(scope="module")
def served(setup):
    """lm-eval's `local-completions` against `lmforge serve` on the three tasks."""
    _checkpoint, _, tasks, model, tokenizer = setup
    with (
        Engine(model, tokenizer, max_batch_size=4) as engine,
        running(create_app(engine, tokenizer, "tiny")) as url,
    ):
        args = (
            f"base_url={url}/v1/completions,model=tiny,tokenizer_backend=remote,"
            f"tokenized_requests=True,num_concurrent=1,max_retries=1,max_length={CONTEXT}"
        )
        yield _lm_eval("local-completions", args, tasks)
        assert engine.busy_slots == 0 and engine.reserved_kv_tokens == 0


def test_lm_eval_local_completions_against_lmforge_serve_equals_lmforge_eval(setup, served):
    checkpoint, _, tasks, *_ = setup
    answers, results = served
    expected, accuracy = _lmforge(checkpoint, tasks, add_bos=True, max_length=API_WINDOW)
    _same(expected, answers)
    got = _accuracies(results)
    assert got["agree_mc"] == accuracy["agree_mc"]
    assert got["agree_gen"] == accuracy["agree_gen"]
    assert got["agree_rolling"] == pytest.approx(accuracy["agree_rolling"], abs=1e-6)


def test_served_choices_score_as_lmforge_eval_tasks_and_hf_with_the_document_start(
    setup, served, reference, reference_no_bos, tmp_path, capsys
):
    """The served path's per-choice log-likelihoods on the multiple-choice YAML equal those
    of `lmforge eval --tasks` and of the hf backend (each at its own full context: the
    questions that fit the API's window), so `<|endoftext|>` comes first on every route."""
    from lmforge.cli import main

    checkpoint, _, tasks, *_ = setup
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(checkpoint),
                "--tasks",
                str(tasks / "agree_mc.yaml"),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    capsys.readouterr()
    rows = [json.loads(line) for line in (tmp_path / "agree_mc.jsonl").read_text().splitlines()]
    cli = [row["loglikelihoods"] for row in rows]
    fits = [i for i in range(len(cli)) if i != LONG_QUESTION]
    got = served[0]["agree_mc"]
    hf, no_bos = reference[0]["agree_mc"], reference_no_bos[0]["agree_mc"]
    for i in fits:
        assert got[i] == pytest.approx(cli[i], abs=1e-4), i
        assert got[i] == pytest.approx(hf[i], abs=1e-4), i
    # without the document start the scores differ, so the checks above could tell
    assert max(abs(a - b) for i in fits for a, b in zip(got[i], no_bos[i], strict=True)) > 1e-3


def test_lmforge_eval_harness_lm_eval_runs_a_task_yaml(setup, reference, capsys):
    from lmforge.cli import main

    checkpoint, _, tasks, *_ = setup
    args = ["eval", "--checkpoint", str(checkpoint), "--harness", "lm-eval"]
    assert main([*args, "--tasks", str(tasks / "agree_mc.yaml")]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["agree_mc"]["acc,none"] == reference[1]["agree_mc"]["acc,none"]


def test_lm_eval_indexes_its_own_tasks_only_when_one_is_named(monkeypatch, tmp_path):
    """Indexing lm-eval's 14,000 tasks takes ~11 s: YAML files alone skip it."""
    from lmforge.eval.lm_eval_model import run_lm_eval

    indexed = []

    class Recorder:
        def __init__(self, include_path=None, include_defaults=True):
            indexed.append((include_path, include_defaults))

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Recorder)
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **_: None)
    task = tmp_path / "mine.yaml"
    task.write_text("task: mine\n")
    run_lm_eval("unused", [str(task)])
    run_lm_eval("unused", [str(task), "hellaswag"])
    assert indexed == [([str(tmp_path.resolve())], False), ([str(tmp_path.resolve())], True)]
