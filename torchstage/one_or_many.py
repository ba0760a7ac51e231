"""One model or a dict of models (also optimizers, schedulers): the one helper every layer uses for either form."""


def named(obj, default_name: str) -> dict:
    """A dict of name -> object for a single object or a dict of them (None gives {})."""
    if obj is None:
        return {}
    return dict(obj) if isinstance(obj, dict) else {default_name: obj}


def each(obj) -> list:
    """The objects of a single object or a dict of them, in order (None gives [])."""
    return list(named(obj, "_").values())


def map_named(fn, obj):
    """``fn`` applied to a single object, or to each value of a dict of them (the same form comes back)."""
    return {k: fn(v) for k, v in obj.items()} if isinstance(obj, dict) else fn(obj)
