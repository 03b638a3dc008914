from torchvision.transforms.functional import __getattr__  # noqa: F401
