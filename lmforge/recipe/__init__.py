"""The self-sizing pretraining recipe: which model shape and how many tokens a wall-clock budget
buys on this machine.

`shapes` is the ladder of candidate shapes the scaling sweep trained, `scaling` the loss rule
fitted on that sweep (`scaling_rule.json`, written by `benchmarks/sweep_scaling.py`), `timing`
times a shape's real training steps here, and `sizing` puts them together: the shape whose
predicted final loss is lowest for the tokens the budget holds at its measured speed.
"""
