import numpy as np
import pytest

from lmforge.data import stdlib_documents
from lmforge.data.classifier import Classifier, Features, featurize, train_classifier
from lmforge.errors import LmforgeError

SENTENCES = """\
The river had risen overnight, and the old bridge groaned under the weight of the water.
She walked to the market every morning and greeted the baker and the woman selling flowers.
Historians still argue about why the empire collapsed so quickly after the long war.
In spring the fields turn green, and farmers begin to plant their first crops of the year.
My grandfather told stories about the winter when the lake froze solid for three months.
The committee will meet again next week to discuss the proposal and vote on the budget.
Children ran through the park, laughing, while their parents watched from the benches.
Some birds migrate thousands of miles every autumn without ever losing their way.
The museum opened a new exhibit about ancient ships and the sailors who built them.
After dinner we sat on the porch and listened to the rain falling on the tin roof.
Her first novel was rejected by eleven publishers before it became a quiet success.
The train was late again, so the passengers crowded into the small station cafe.
Doctors recommend a short walk after meals, especially for people who sit all day.
The mountain village has no road, and supplies still arrive on the backs of mules.
He learned to play the violin at forty and now performs with the town orchestra.
A thick fog rolled in from the sea and hid the lighthouse for most of the evening.
The recipe calls for fresh basil, ripe tomatoes, olive oil, and a pinch of salt.
Voters in the northern districts turned out in record numbers despite the storm.
The old library smells of paper and dust, and the floorboards creak with every step.
Our neighbors adopted a dog that barks at the postman but loves the children.
The bakery on the corner sells bread that is still warm at seven in the morning.
Engineers inspected the tunnel and found cracks that will take a year to repair.
The festival ends with fireworks over the harbor and music until long past midnight.
She kept a diary for sixty years, and her grandson is now turning it into a book.
"""


def prose_samples(sentences: list[str], count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(sentences, int(rng.integers(3, 9)))) for _ in range(count)]


def code_samples(count: int) -> list[str]:
    out = []
    for doc in stdlib_documents():
        out += [doc.text[i : i + 1200] for i in range(0, min(len(doc.text), 6000), 1200)]
        if len(out) >= count:
            return out[:count]
    return out


@pytest.fixture(scope="module")
def data():
    lines = SENTENCES.splitlines()
    code = code_samples(700)
    return {
        "train": (code[:400], prose_samples(lines[:16], 400, seed=0)),
        # Unseen files; new paragraphs, a third of whose sentences training never saw.
        "test": (code[400:], prose_samples(lines, 300, seed=1)),
    }


@pytest.fixture(scope="module")
def model(data):
    code, prose = data["train"]
    return train_classifier(code, prose, epochs=3, buckets=1 << 18, seed=0)


def test_held_out_python_and_prose_are_told_apart(model, data):
    code, prose = data["test"]
    accuracy = np.r_[model.score_batch(code) > 0.5, model.score_batch(prose) < 0.5].mean()
    assert accuracy >= 0.95
    assert model.score("for key, value in sorted(items.items()):\n    print(key)\n") > 0.5
    assert 0.0 <= model.score("") <= 1.0


def test_saved_model_gives_identical_scores(model, data, tmp_path):
    path = tmp_path / "quality.safetensors"
    model.save(path)
    loaded = Classifier.load(path)
    texts = data["test"][0][:50] + data["test"][1][:50]
    assert np.array_equal(loaded.score_batch(texts), model.score_batch(texts))
    assert loaded.features == model.features
    (tmp_path / "plain.txt").write_text("")  # the saved file gets the mode any other file gets
    assert path.stat().st_mode == (tmp_path / "plain.txt").stat().st_mode


def test_training_is_seeded(data):
    code, prose = data["train"]
    a = train_classifier(code[:100], prose[:100], epochs=1, buckets=1 << 16, seed=4)
    b = train_classifier(code[:100], prose[:100], epochs=1, buckets=1 << 16, seed=4)
    assert np.array_equal(a.weights, b.weights)


def test_features_are_unit_length_hashed_ngrams():
    x = featurize(["a b a", "", "c"], Features(buckets=1024, ngrams=2))
    assert np.diff(x.indptr).tolist() == [4, 0, 1]  # "a", "b", "a b", "b a"; nothing; "c"
    norms = [np.linalg.norm(x.value[x.indptr[i] : x.indptr[i + 1]]) for i in (0, 2)]
    assert np.allclose(norms, 1.0)
    assert (x.index < 1024).all()


def test_load_rejects_other_files(tmp_path):
    from safetensors.numpy import save_file

    other = tmp_path / "other.safetensors"
    save_file({"weights": np.zeros(4, np.float32)}, str(other))
    with pytest.raises(LmforgeError, match="not an lmforge classifier"):
        Classifier.load(other)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a model")
    with pytest.raises(LmforgeError, match="not a readable"):
        Classifier.load(junk)
    with pytest.raises(LmforgeError, match="positive and negative"):
        train_classifier([], ["x"])
