"""The docs runner itself: directives, order, a shared folder, failures that name the block,
background processes stopped at the end of the page."""

import textwrap

import pytest
import runner


def page(tmp_path, text):
    path = tmp_path / "page.md"
    path.write_text(textwrap.dedent(text))
    return path


def test_blocks_run_in_order_in_one_folder_with_directives(tmp_path):
    path = page(
        tmp_path,
        """\
        # A page

        ```bash
        echo one > notes.txt
        ```

        <!-- test: smallest "--steps 1000" "--steps 2" -->
        <!-- test: smallest "big" "small" -->
        ```bash
        echo "big --steps 1000" >> notes.txt
        ```

        <!-- test: skip "needs two machines" -->
        ```bash
        exit 1
        ```

        ```text
        exit 1
        ```

        ```console
        $ exit 1
        ```

        ```python
        import os
        assert os.environ["LMFORGE_PROGRESS"] == "0"
        print(open("notes.txt").read().split())
        assert open("notes.txt").read().split() == ["one", "small", "--steps", "2"]
        ```
        """,
    )
    ran = runner.run_page(path, tmp_path / "work", tmp_path / "cache")
    assert [r.skipped for r in ran] == [False, False, True, False]


def test_a_failing_block_fails_the_page_naming_it(tmp_path):
    path = page(
        tmp_path,
        """\
        ```bash
        echo fine
        ```

        ```bash
        lmforge tokenize --no-such-flag
        ```
        """,
    )
    with pytest.raises(runner.BlockFailed, match="block at line 5, exited with status 2"):
        runner.run_page(path, tmp_path / "work", tmp_path / "cache")


def test_stale_or_stray_directives_are_errors(tmp_path):
    stale = page(tmp_path, '<!-- test: smallest "absent" "x" -->\n```bash\necho hi\n```\n')
    with pytest.raises(runner.PageError, match="does not contain"):
        runner.run_page(stale, tmp_path / "a", tmp_path / "cache")
    with pytest.raises(runner.PageError, match="directly above"):
        runner.parse('<!-- test: skip "x" -->\nsome text\n```bash\necho hi\n```\n')
    with pytest.raises(runner.PageError, match="unknown test directive"):
        runner.parse('<!-- test: smalest "a" "b" -->\n```bash\necho hi\n```\n')


def test_background_processes_stop_with_the_page(tmp_path):
    path = page(
        tmp_path,
        """\
        ```bash
        sleep 300 &
        echo $! > sleeper.pid
        ```
        """,
    )
    runner.run_page(path, tmp_path / "work", tmp_path / "cache")
    pid = int((tmp_path / "work" / "sleeper.pid").read_text())
    import os

    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            import time

            time.sleep(0.1)


def test_commands_are_checked_against_the_parser():
    blocks = runner.parse(
        textwrap.dedent(
            """\
            ```bash
            lmforge speedrun --preset tiny \\
                --out runs/x && lmforge eval --checkpoint runs/x  # a comment
            LMFORGE_THREADS=1 lmforge train --max-steps $STEPS
            torchrun --nproc-per-node 2 -m lmforge train --parallel fsdp=2 --max-steps 2
            lmforge spedrun
            lmforge train --max-steps many
            ```

            ```python
            print("unclosed"
            ```
            """
        )
    )
    errors = runner.command_errors(blocks[0]) + runner.command_errors(blocks[1])
    assert len(errors) == 3, errors
    assert "spedrun" in errors[0] and "invalid int value" in errors[1]
    assert "does not compile" in errors[2]
