"""The one exception type users see: a message that names the problem and the fix."""


class TpuplexError(Exception):
    """A user-facing error. The CLI prints its message on one line and exits non-zero, without a traceback.

    Messages name what is wrong (the field, file or value) and what to do instead.
    """
