"""Argument errors that name their argument, so a ``train()`` argument that configures a callback is named as given."""
import contextlib
import numbers


class ArgumentError(ValueError):
    """``"<name> <problem>"``: a malformed argument; :func:`named_as` renames it to the argument the user wrote."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name} {problem}")
        self.name, self.problem = name, problem


@contextlib.contextmanager
def named_as(**names):
    """Inside, an :class:`ArgumentError` about parameter ``p`` is re-raised naming ``names[p]`` instead."""
    try:
        yield
    except ArgumentError as exc:
        if exc.name not in names:
            raise
        raise ArgumentError(names[exc.name], exc.problem) from None


def check_int(name: str, value, minimum: int = 1) -> int:
    """``value`` if it is an integer (not a bool) >= ``minimum``; else an ArgumentError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentError(name, f"must be an integer >= {minimum}, got {value!r}")
    return value


def check_positive(name: str, value):
    """``value`` if it is None or a real number > 0 (not a bool); else an ArgumentError naming ``name``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0):
        raise ArgumentError(name, f"must be a number > 0 or None, got {value!r}")
    return value
