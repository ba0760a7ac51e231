"""How a Catalyst-capable class stands for the core class it extends: ``isinstance(x, torchstage.OptimizerCallback)``
is true of the core callback that a runner's default chain builds, as it was when there was one class."""
from abc import ABCMeta


class StandsForCore(ABCMeta):
    """Metaclass of a compat class declared ``class X(core.X, metaclass=StandsForCore, core=core.X)``: instances
    and subclasses of ``core.X`` count as ``X``'s. A user's subclass of ``X`` stands only for itself. (An ABCMeta,
    so that a user's class may also derive from ``abc.ABC``.)"""

    def __new__(mcs, name, bases, namespace, core=None, **kwargs):
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        cls._stands_for = core
        return cls

    def __init__(cls, name, bases, namespace, core=None, **kwargs):
        super().__init__(name, bases, namespace, **kwargs)

    def __instancecheck__(cls, obj) -> bool:
        core = cls.__dict__.get("_stands_for")
        return super().__instancecheck__(obj) or (core is not None and isinstance(obj, core))

    def __subclasscheck__(cls, sub) -> bool:
        core = cls.__dict__.get("_stands_for")
        return super().__subclasscheck__(sub) or (core is not None and issubclass(sub, core))
