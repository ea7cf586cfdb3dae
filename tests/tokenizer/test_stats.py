"""`lmforge tokenizer stats`: bytes per token side by side, GPT-2 included."""

import importlib.util
from pathlib import Path

from lmforge.cli import main
from lmforge.tokenizer import train_bpe
from lmforge.tokenizer.stats import compression, load_named


def test_compression_counts_tokens_and_bytes(stdlib_texts, gpt2_folder):
    gpt2 = load_named(str(gpt2_folder))
    small = train_bpe(stdlib_texts, 300)
    rows = compression({"gpt2": gpt2, "small": small}, stdlib_texts[:2])
    n_bytes = sum(len(t.encode()) for t in stdlib_texts[:2])
    assert [r.bytes for r in rows] == [n_bytes, n_bytes]
    assert rows[0].tokens == sum(len(gpt2.encode_ordinary(t)) for t in stdlib_texts[:2])
    assert rows[0].bytes_per_token > rows[1].bytes_per_token > 1  # 50k merges beat 44


def test_stats_command_compares_with_gpt2_ranks_file(stdlib_texts, gpt2_folder, tmp_path, capsys):
    whisper = Path(importlib.util.find_spec("whisper").submodule_search_locations[0])
    ranks_file = whisper / "assets" / "gpt2.tiktoken"
    assert load_named(str(ranks_file)).eot_id == 50256
    doc = tmp_path / "doc.txt"
    doc.write_text(stdlib_texts[0], encoding="utf-8")
    code = main(
        [
            "tokenizer",
            "stats",
            "--tokenizer",
            str(ranks_file),
            str(gpt2_folder),
            "--input",
            str(doc),
        ]
    )
    table = capsys.readouterr().out.splitlines()
    assert code == 0
    assert table[0].startswith("| tokenizer | vocab | tokens | bytes/token")
    first, second = table[2].split("|"), table[3].split("|")
    assert first[2].strip() == second[2].strip() == "50,257"
    assert first[3] == second[3]  # the ranks file and the folder are the same tokenizer
    assert second[5].strip() == "1.00x"
