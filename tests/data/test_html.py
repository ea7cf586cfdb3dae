"""HTML → text: paragraphs kept, scripts dropped, encodings detected when declared wrongly."""

from lmforge.data.documents import Document
from lmforge.data.html import decode_html, html_to_text
from lmforge.data.pipeline.steps import Extract

PAGE = (
    "<html><head><title>T</title><style>p {color: red}</style></head><body>"
    "<h1>Café crème</h1><p>First paragraph with <b>bold</b> text.</p>"
    "<p>Second paragraph.</p><ul><li>one</li><li>two</li></ul>"
    "<script>var tracking = 1;</script></body></html>"
)


def test_extraction_keeps_paragraph_structure_and_drops_scripts():
    text = html_to_text(PAGE)
    assert text.split("\n\n")[:3] == [
        "Café crème",
        "First paragraph with bold text.",
        "Second paragraph.",
    ]
    assert "one" in text and "two" in text
    assert "tracking" not in text and "color" not in text


def test_page_declaring_utf8_but_written_in_cp1252_is_decoded():
    raw = PAGE.replace("<head>", '<head><meta charset="utf-8">').encode("cp1252")
    text, encoding = decode_html(raw, declared="utf-8")
    assert encoding == "cp1252"
    assert "Café crème" in html_to_text(text)


def test_undeclared_cyrillic_and_japanese_pages_are_detected():
    ru = "<p>" + "Съешь же ещё этих мягких французских булок, да выпей чаю. " * 4 + "</p>"
    ja = "<p>" + "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。" * 4 + "</p>"
    for page, codec in ((ru, "koi8-r"), (ru, "cp1251"), (ja, "shift_jis")):
        text, _ = decode_html(page.encode(codec))
        assert html_to_text(text).startswith(page[3:20]), codec


def test_extract_step_converts_html_documents_only():
    step = Extract()
    docs = [
        Document("a", PAGE, {"format": "html"}),
        Document("b", "plain text stays", {}),
        Document("c", "<html><body><script>x</script></body></html>", {"format": "html"}),
    ]
    out = list(step(docs))
    assert [d.id for d in out] == ["a", "b"]
    assert out[0].text.startswith("Café crème\n\n") and out[0].meta["format"] == "text"
    assert out[1].text == "plain text stays"
    assert step.stats.removed == {"no_text_extracted": 1}
