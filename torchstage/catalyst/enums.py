"""``torchstage.CallbackOrder`` and ``CallbackScope`` for Catalyst users: the core enums, whose members they return
(``CallbackOrder.Metric is`` the core member), also reading Catalyst 20.12's spellings (``CallbackOrder.external``,
``CallbackNode.master``) with a one-time note."""
from torchstage.callbacks import base
from torchstage.catalyst.names import enum_alias


class CatalystEnum(type):
    """A class standing for the core enum ``_core``: members, calls, iteration and ``isinstance`` are the core
    enum's; a name it lacks is read as Catalyst 20.12's spelling of one (or refused with the reason)."""

    def __getattr__(cls, name):
        if name.startswith("_"):
            raise AttributeError(name)
        core = cls._core
        if name in core.__members__ or hasattr(core, name):
            return getattr(core, name)
        return enum_alias(core, name)

    def __call__(cls, *args, **kwargs):
        return cls._core(*args, **kwargs)

    def __getitem__(cls, name):
        return cls._core[name]

    def __iter__(cls):
        return iter(cls._core)

    def __len__(cls):
        return len(cls._core)

    def __contains__(cls, member):
        return member in cls._core

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls._core)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, cls._core)

    def __repr__(cls):
        return repr(cls._core)

    @property
    def __members__(cls):
        return cls._core.__members__


class CallbackOrder(metaclass=CatalystEnum):
    """The phases of the chain (:class:`torchstage.callbacks.base.CallbackOrder`), also spelled as in Catalyst
    20.12 (``CallbackOrder.external``, ``.metric``...)."""

    _core = base.CallbackOrder


class CallbackScope(metaclass=CatalystEnum):
    """Which ranks run a callback (:class:`torchstage.callbacks.base.CallbackScope`). Catalyst 20.12 called this
    ``CallbackNode`` (``all``/``master``); its ``CallbackScope.stage/experiment`` (a callback's lifetime across
    stages) does not exist here and fails with an explanation."""

    _core = base.CallbackScope
