"""The commands that span stages, each module adding its subcommands and running them.

A stage that can run its command alone owns it (`data/command.py`, `eval/command.py`,
`infer/command.py`, `parallel/command.py`); the commands here need more than one stage or sit
above config: `train` and `speedrun` (run.py), `tokenizer` and `tokenize` (prepare.py),
`export` and `import` (hf.py), `plan` (plan.py) and `doctor` (doctor.py). Every module is
torch-free at import: torch-backed modules are imported inside the function that runs the
command.
"""
