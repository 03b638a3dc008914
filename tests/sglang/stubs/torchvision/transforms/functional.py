def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"torchvision stub: {__name__}.{name} is import-only")

    return unavailable
