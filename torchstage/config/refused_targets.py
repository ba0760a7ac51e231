"""What ``--allow-targets`` never admits, whatever its prefixes and names: callables that read files as code, run
code from strings, write files or start processes. A training config builds modules, losses, optimizers,
schedulers, datasets, samplers, callbacks and loggers; none of these needs what is listed here.
"""

#: Modules whose every callable runs code it reads or starts processes (checked against where the object is
#: defined, so another name for it is refused too).
REFUSED_MODULES = {
    "torch.hub": "runs a repository's hubconf.py and downloads code",
    "torch.package": "imports the code a package file holds",
    "torch.utils.cpp_extension": "compiles and loads native code",
    "torch.utils.benchmark": "executes statements given as strings",
    "torch.utils.collect_env": "runs shell commands",
    "torch.multiprocessing": "starts processes",
    "torch.distributed.run": "starts processes",
    "torch.distributed.launcher": "starts processes",
    "torch.distributed.elastic": "starts processes",
    "torch.distributed.checkpoint": "reads checkpoint data through pickle",
    "torch.distributed.rpc": "runs functions on other processes",
    "torch.backends.xeon": "starts processes",
    "torch.utils.bottleneck": "runs a script",
    "numpy.f2py": "compiles and runs code",
    "numpy.ctypeslib": "loads native libraries",
    "torchstage.launch": "starts and restarts processes",
    "torchstage.commands": "runs torchstage commands",
    "torchstage.cli": "runs torchstage commands",
    "torchstage.__main__": "runs torchstage commands",
    "torchstage.files": "writes files",
    "torch.distributed.launch": "starts processes",
    "torch.utils.model_dump": "runs its module code when imported",
    "torch.utils.tensorboard": "writes files",
    "torch.onnx": "writes files",
    "os": "writes files and starts processes",
    "subprocess": "starts processes",
    "shutil": "writes files",
    "pathlib": "writes files",
    "io": "writes files",
    "tempfile": "writes files",
    "builtins": "opens files and runs code",
    "runpy": "runs code",
    "importlib": "imports code",
    "pickle": "runs code",
    "multiprocessing": "starts processes",
    "pty": "starts processes",
    "webbrowser": "starts processes",
    "ctypes": "loads native libraries",
}

#: Single callables that read a file as code: ``(defining module, name)`` -> why.
REFUSED_CALLABLES = {
    ("torch.jit._serialization", "load"): "runs the TorchScript code a file holds",
    ("torch.export", "load"): "reads a program from a file",
    ("torch._ops", "load_library"): "loads a native library",
    ("torch._classes", "load_library"): "loads a native library",
    ("torch.serialization", "save"): "writes files",
    ("torch.jit._serialization", "save"): "writes files",
    ("torch.export", "save"): "writes files",
    ("numpy", "save"): "writes files",
    ("numpy", "savez"): "writes files",
    ("numpy", "savez_compressed"): "writes files",
    ("numpy", "savetxt"): "writes files",
    ("numpy", "memmap"): "writes files",
}

#: Loaders that are safe only with one argument's safe value: ``(defining module, name)`` -> (argument, the safe
#: value, its value when the config omits it, what happens otherwise). ``torch.load``'s default changed across
#: torch versions, so the config must say ``weights_only: true``.
ARGUMENT_GUARDED = {
    ("torch.serialization", "load"): ("weights_only", True, None, "unpickles the file, which can run code"),
    ("numpy", "load"): ("allow_pickle", False, False, "unpickles object arrays, which can run code"),
    ("numpy.lib.format", "read_array"): ("allow_pickle", False, False, "unpickles object arrays, which can run code"),
}


def refused_module(module: str):
    """Why every callable of ``module`` is refused (it is one of REFUSED_MODULES or inside one); None if not."""
    for refused, why in REFUSED_MODULES.items():
        if module == refused or module.startswith(refused + "."):
            return f"is in {refused!r}, which {why}"  # "it is in 'torch.distributed.launch', which starts processes"
    return None


def refusal(obj, kwargs=None):
    """Why ``obj`` (called with ``kwargs``, None when not known yet) is refused under an allow-list; None if not."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
    if not isinstance(module, str):
        return None
    for refused, why in REFUSED_MODULES.items():
        if module == refused or module.startswith(refused + "."):
            return f"it is defined in {module!r}, which {why}"
    why = REFUSED_CALLABLES.get((module, name))
    if why is not None:
        return f"{module}.{name} {why}"
    guard = ARGUMENT_GUARDED.get((module, name))
    if guard is not None:
        argument, safe, omitted, why = guard
        if kwargs is None or kwargs.get(argument, omitted) is not safe:
            return f"{module}.{name} {why}; it is allowed only with {argument}: {str(safe).lower()}"
    return None
