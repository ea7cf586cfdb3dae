"""The one exception type for mistakes a user can fix (bad path, bad config, wrong checkpoint).

The CLI prints these as a single line without a traceback and exits non-zero; anything else
is a bug and keeps its traceback.
"""


class LmforgeError(Exception):
    """A user-fixable problem. The message names the problem and the fix in one line."""
